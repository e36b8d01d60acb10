package main

import (
	"testing"

	"github.com/amf-edge/amf/internal/depcheck"
)

// TestDeps keeps the sidecar small: no package testing, no Kubernetes client.
func TestDeps(t *testing.T) {
	depcheck.Forbid(t, "amf-sidecar", "testing", "k8s.io/client-go/")
}
