package contract

// The six features, in the order of the dataset's columns and of the model's
// inputs.
const (
	CPUPercent = iota
	MemoryPercent
	NetworkIOBytesPerSec
	DiskIOBytesPerSec
	CPUGrowthRate
	MemoryGrowthRate
	NumFeatures
)

// FeatureNames returns the feature names in input order, equal to the
// dataset's column names, the model manifest's feature_names and the JSON
// fields of a signal's features. A function, not a variable, so no caller can
// change the schema for everyone.
func FeatureNames() [NumFeatures]string {
	return [NumFeatures]string{
		"cpu_percent",
		"memory_percent",
		"network_io_bytes_per_sec",
		"disk_io_bytes_per_sec",
		"cpu_growth_rate",
		"memory_growth_rate",
	}
}
