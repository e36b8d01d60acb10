package detect

import (
	"testing"

	"github.com/amf-edge/amf/infer/model"
)

func TestNormaliseScalesOnlyCPUAndMemory(t *testing.T) {
	x := [6]float64{40, 30, 1000, 2000, 0.1, 50}
	Normalise(&x, model.Normalisation{CPUReferenceFraction: 0.5, MemoryReferenceFraction: 0.25})
	want := [6]float64{80, 120, 1000, 2000, 0.2, 200}
	if x != want {
		t.Fatalf("normalised %v, want %v", x, want)
	}
}
