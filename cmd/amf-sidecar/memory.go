package main

import (
	"flag"
	"strconv"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/contract"
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
	n, err := contract.ParseMemoryQuantity(s)
	if err != nil {
		return err
	}
	f.ref = &cgroup.MemoryReference{Bytes: float64(n), Source: detect.RefFlag,
		Why: "no memory limit on the container: --memory-reference " + s}
	return nil
}
