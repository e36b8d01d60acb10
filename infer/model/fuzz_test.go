package model

import (
	"errors"
	"math"
	"testing"
)

// FuzzLoad feeds arbitrary model text and manifests to Load. With fixSHA
// the manifest is the default one carrying the input's sha256, so the
// fuzzer reaches the text validator and leaves. Load must never panic; a
// model it accepts must score every probe in [0, 1].
//
// Seeds live in testdata/fuzz/FuzzLoad (run as regression cases by plain
// `go test`). Fuzz with: go test ./infer/model/ -run '^$' -fuzz FuzzLoad -fuzztime 30s
func FuzzLoad(f *testing.F) {
	mb, jb := defaultBytes(f)
	f.Add([]byte(tinyModel), []byte(nil), true)
	f.Add(mb[:2048], jb, false)
	f.Add([]byte("tree\nversion=v3\n"), []byte("{}"), true)
	f.Fuzz(func(t *testing.T, model, manifest []byte, fixSHA bool) {
		if fixSHA {
			manifest = manifestFor(t, model, nil)
		}
		m, err := Load(model, manifest)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || le.Kind == nil || err.Error() == "" {
				t.Fatalf("error %T %q is not a *LoadError with a kind", err, err)
			}
			if m != nil {
				t.Fatal("model and error both returned")
			}
			return
		}
		nan := math.NaN()
		for _, x := range [][NumFeatures]float64{{}, {nan, nan, nan, nan, nan, nan}, {1e300, -1e300, 5, 80, 80.0000001, -3}} {
			if p := m.Score(&x); !(p >= 0 && p <= 1) {
				t.Fatalf("score %v for %v", p, x)
			}
		}
	})
}
