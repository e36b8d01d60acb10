package main

import (
	"testing"

	"github.com/amf-edge/amf/internal/depcheck"
)

// TestDeps keeps package testing out of the product binary (it registers test flags).
func TestDeps(t *testing.T) {
	depcheck.Forbid(t, "amf-agent", "testing")
}
