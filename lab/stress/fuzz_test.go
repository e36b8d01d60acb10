package stress

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseProfile checks that any spec either parses into a valid profile
// whose String parses back to the same profile, or fails with a *SyntaxError
// that points inside the spec at the text it quotes. Its corpus is kept in
// testdata/fuzz/FuzzParseProfile; run `go test -fuzz FuzzParseProfile
// ./lab/stress/` to extend it.
func FuzzParseProfile(f *testing.F) {
	for _, s := range []string{
		"60s",
		"60s;120s:mem=60Mi,cpu=0.4;60s:mem=150Mi",
		"60s:mem=60Mi,cpu=0.4;60s:mem=150Mi,ramp=10Mi/s",
		" 1m30s : mem = 1.5Gi , cpu = 400m ",
		"1s:mem=0.3,ramp=1.7k/s,cpu=0.3m",
		"60s;",
		"60s:mem=60m",
		"1h:cpu=64",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		p, err := ParseProfile(spec)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("%q: error %v is not a *SyntaxError", spec, err)
			}
			if se.Offset < 0 || se.Offset > len(spec) || !strings.HasPrefix(spec[se.Offset:], se.Text) {
				t.Fatalf("%q: error %v points at offset %d, not at %q", spec, err, se.Offset, se.Text)
			}
			if se.Phase < 1 || se.Msg == "" {
				t.Fatalf("%q: error %+v", spec, se)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("%q parsed into an invalid profile: %v", spec, err)
		}
		for _, ph := range p.Phases {
			if math.IsNaN(ph.CPU) || math.IsInf(ph.CPU, 0) {
				t.Fatalf("%q: cpu %v", spec, ph.CPU)
			}
		}
		q, err := ParseProfile(p.String())
		if err != nil {
			t.Fatalf("%q → %q does not parse: %v", spec, p.String(), err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("%q → %q → %+v, want %+v", spec, p.String(), q, p)
		}
	})
}
