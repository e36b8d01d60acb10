package podsignal

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/amf-edge/amf/contract"
)

// TestFeaturesJSONNames: the JSON names of Features, in field order, are the
// feature schema, so a signal, a metric label and a model input agree.
func TestFeaturesJSONNames(t *testing.T) {
	one := 1.0
	b, err := json.Marshal(Features{CPUPercent: &one, MemoryPercent: &one, NetworkIOBytesPerSec: &one, DiskIOBytesPerSec: &one, CPUGrowthRate: &one, MemoryGrowthRate: &one})
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	var keys []string
	_, _ = dec.Token()
	for dec.More() {
		k, _ := dec.Token()
		keys = append(keys, k.(string))
		_, _ = dec.Token()
	}
	if want := contract.FeatureNames(); !slices.Equal(keys, want[:]) {
		t.Fatalf("Features has JSON names %v, the schema is %v", keys, want)
	}
}
