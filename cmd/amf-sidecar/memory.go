package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/detect"
)

// memoryReferenceFlag is --memory-reference: memory_percent's reference for
// a broker without a memory limit of its own, in bytes or with a binary
// suffix as in a Kubernetes memory quantity (256Mi). Unset, the sidecar uses
// what bounds the container (sidecar.Config.MemoryReference).
type memoryReferenceFlag struct {
	ref *cgroup.MemoryReference
}

const memoryReferenceHelp = "memory_percent's reference for a broker without a memory limit of its own, in bytes or with a suffix Ki, Mi, Gi or Ti (e.g. 256Mi): what the broker may use. Default: the nearest memory limit above the container (the pod's, else the kubelet's kubepods = the node's allocatable memory), else the machine's memory. A container's own limit always wins"

func registerMemoryReference(fs *flag.FlagSet) *memoryReferenceFlag {
	f := &memoryReferenceFlag{}
	fs.Var(f, "memory-reference", memoryReferenceHelp)
	return f
}

func (f *memoryReferenceFlag) String() string {
	if f == nil || f.ref == nil {
		return ""
	}
	return strconv.FormatFloat(f.ref.Bytes, 'f', -1, 64)
}

func (f *memoryReferenceFlag) Set(s string) error {
	n, err := parseMemoryQuantity(s)
	if err != nil {
		return err
	}
	f.ref = &cgroup.MemoryReference{Bytes: float64(n), Source: detect.RefFlag,
		Why: "no memory limit on the container: --memory-reference " + s}
	return nil
}

var binarySuffixes = []struct {
	suffix string
	shift  uint
}{{"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40}}

// parseMemoryQuantity parses a positive whole number of bytes with an
// optional binary suffix. Decimal suffixes (k, M, G) and fractions, which
// Kubernetes also takes, are refused rather than guessed at.
func parseMemoryQuantity(s string) (uint64, error) {
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
		return 0, fmt.Errorf("%q: a memory reference must be positive", s)
	}
	return n << shift, nil
}
