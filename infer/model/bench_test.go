package model

import (
	"math"
	"testing"

	"github.com/amf-edge/amf/contract"
)

var sink float64

// BenchmarkScore: one prediction through Score with the default model.
// Target: <= 5 µs and 0 allocs/op.
func BenchmarkScore(b *testing.B) {
	m, err := Default()
	if err != nil {
		b.Fatal(err)
	}
	xs := [][contract.NumFeatures]float64{
		{0.28, 8.09, 996.3, 57.4, 9.26e-08, 1.57},  // a quiet broker
		{85.0, 60.2, 20000, 400, 0.002, 15000},     // saturated CPU
		{12, math.NaN(), 1500, 0, math.NaN(), 3.5}, // missing values
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sink += m.Score(&xs[i%len(xs)])
	}
}

// BenchmarkLoadDefault: full load and validation of the embedded model
// (manifest, sha256, text validation, leaves, cross-check). Target <= 50 ms.
func BenchmarkLoadDefault(b *testing.B) {
	mb, jb, err := EmbeddedFiles(DefaultName)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Load(mb, jb); err != nil {
			b.Fatal(err)
		}
	}
}
