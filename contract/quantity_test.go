package contract

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseMemoryQuantity(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
		err  string
	}{
		{"104857600", 100 << 20, ""},
		{"256Mi", 256 << 20, ""},
		{"1Gi", 1 << 30, ""},
		{"64Ki", 64 << 10, ""},
		{"2Ti", 2 << 40, ""},
		{"0", 0, "must be positive"},
		{"0Mi", 0, "must be positive"},
		{"100M", 0, "want a whole number of bytes"},
		{"1.5Gi", 0, "want a whole number"},
		{"-1", 0, "want a whole number"},
		{"Mi", 0, "want a whole number"},
		{"", 0, "want a whole number"},
		{"99999999999Ti", 0, "too large"},
	} {
		got, err := ParseMemoryQuantity(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: %d, %v; want an error saying %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%q: %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

// FuzzParseMemoryQuantity: what parses is positive and writes back as the
// input (digits, then the suffix it had).
func FuzzParseMemoryQuantity(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseMemoryQuantity(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("%q: error %q does not name the input", s, err)
			}
			return
		}
		if n == 0 || n > 1<<53 {
			t.Fatalf("%q parsed as %d", s, n)
		}
		for _, b := range binarySuffixes {
			if strings.HasSuffix(s, b.suffix) {
				if n%(1<<b.shift) != 0 {
					t.Fatalf("%q parsed as %d, not a whole number of %s", s, n, b.suffix)
				}
				n >>= b.shift
				break
			}
		}
		digits := strings.TrimRight(s, "KMGTi")
		if v, err := strconv.ParseUint(digits, 10, 64); err != nil || v != n {
			t.Fatalf("%q parsed as %d", s, n)
		}
	})
}
