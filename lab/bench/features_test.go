package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
)

// TestFeaturesReadTheLoadTheyReplay: amf-lab stress holding 40 MiB in a
// cgroup of its own with a 256 MiB limit reads as memory_percent of at
// least 40/256 and a CPU rate above 0 once it burns, and the cgroup is gone
// afterwards.
func TestFeaturesReadTheLoadTheyReplay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("makes cgroups: root only")
	}
	self := filepath.Join(t.TempDir(), "amf-lab")
	if msg, err := exec.Command("go", "build", "-o", self, "../../cmd/amf-lab").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var mem, cpu []float64
	err := RunFeatures(ctx, FeaturesConfig{Profile: "4s:mem=40Mi,cpu=0.3", Self: self}, func(fs FeatureSample) error {
		v := fs.Record.Features.Values
		mem, cpu = append(mem, v[contract.MemoryPercent]), append(cpu, v[contract.CPUPercent])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(mem) < 3 {
		t.Fatalf("%d samples of a 4 s load at 1 s; want at least 3", len(mem))
	}
	if last, want := mem[len(mem)-1], 100*40.0/256; !(last >= want) {
		t.Errorf("memory_percent %v at the end of the load; want at least %.2f (40 MiB of 256)", mem, want)
	}
	if last := cpu[len(cpu)-1]; !(last > 0) {
		t.Errorf("cpu_percent %v while burning 0.3 of a core; want above 0", cpu)
	}
	for _, glob := range []string{"/sys/fs/cgroup/amf-bench-*", "/sys/fs/cgroup/*/amf-bench-*"} {
		if left, _ := filepath.Glob(glob); len(left) > 0 {
			t.Errorf("cgroups left behind: %v", left)
		}
	}
}
