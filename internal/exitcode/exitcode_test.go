package exitcode

import (
	"errors"
	"flag"
	"fmt"
	"testing"
)

func TestOfFollowsTheConvention(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want int
	}{
		{"done", nil, OK},
		{"help asked for", flag.ErrHelp, OK},
		{"help, wrapped", fmt.Errorf("inject: %w", flag.ErrHelp), OK},
		{"a usage error", Usagef("unexpected arguments %q", "x"), Usage},
		{"a usage error, wrapped", fmt.Errorf("inject: %w", UsageErr(errors.New("document 1: not YAML"))), Usage},
		{"a failure", errors.New("listen tcp :1884: address already in use"), Failure},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Of(tt.err); got != tt.want {
				t.Errorf("Of(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
	if UsageErr(nil) != nil {
		t.Error("UsageErr(nil) is not nil")
	}
	if ForParse(flag.ErrHelp) != OK || ForParse(errors.New("flag provided but not defined: -x")) != Usage {
		t.Error("ForParse does not give OK for -h and Usage otherwise")
	}
}
