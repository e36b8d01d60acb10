package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/amf-edge/amf/internal/exitcode"
)

// TestExitStatusesFollowTheConvention: 0 for help, 2 for a wrong command
// line (package exitcode).
func TestExitStatusesFollowTheConvention(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want int
	}{
		{"help", []string{"--help"}, exitcode.OK},
		{"stress help", []string{"stress", "-h"}, exitcode.OK},
		{"bench help", []string{"bench", "flood", "-h"}, exitcode.OK},
		{"unknown command", []string{"serve"}, exitcode.Usage},
		{"stress unknown flag", []string{"stress", "--bogus"}, exitcode.Usage},
		{"stress without a profile", []string{"stress"}, exitcode.Usage},
		{"stress bad profile", []string{"stress", "--profile", "forever"}, exitcode.Usage},
		{"soak help", []string{"soak", "-h"}, exitcode.OK},
		{"soak an unknown fault", []string{"soak", "--faults", "crash,meteor"}, exitcode.Usage},
		{"soak no duration", []string{"soak", "--duration", "0s"}, exitcode.Usage},
		{"soak an unknown pair", []string{"soak", "--pairs", "sidecar,daemon"}, exitcode.Usage},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if got := run(context.Background(), tt.args, &out, &errb); got != tt.want {
				t.Errorf("exit %d, want %d; stderr:\n%s", got, tt.want, errb.String())
			}
		})
	}
}
