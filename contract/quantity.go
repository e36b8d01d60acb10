package contract

import (
	"fmt"
	"strconv"
	"strings"
)

var binarySuffixes = []struct {
	suffix string
	shift  uint
}{{"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40}}

// ParseMemoryQuantity parses a positive whole number of bytes with an
// optional binary suffix, as in a Kubernetes memory quantity (256Mi): the
// sidecar's --memory-reference and the policy's amf.io/memory-ceiling.
// Decimal suffixes (k, M, G) and fractions, which Kubernetes also takes, are
// refused rather than guessed at.
func ParseMemoryQuantity(s string) (uint64, error) {
	digits, shift := s, uint(0)
	for _, b := range binarySuffixes {
		if d, ok := strings.CutSuffix(s, b.suffix); ok {
			digits, shift = d, b.shift
			break
		}
	}
	if digits == "" || strings.TrimLeft(digits, "0123456789") != "" {
		return 0, fmt.Errorf("%q: want a whole number of bytes, optionally with Ki, Mi, Gi or Ti (e.g. 256Mi)", s)
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n > (1<<53)>>shift { // exact as a float64, as the features compute
		return 0, fmt.Errorf("%q: too large", s)
	}
	if n == 0 {
		return 0, fmt.Errorf("%q: a memory quantity must be positive", s)
	}
	return n << shift, nil
}
