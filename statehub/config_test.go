package statehub

import (
	"strings"
	"testing"
)

// TestValidateNeedsAnAuthenticatorAndABudgetForOneState: the zero budget
// takes the default; one below a single state's bound is refused, naming
// MaxBytes.
func TestValidateNeedsAnAuthenticatorAndABudgetForOneState(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want string // in the error; "" passes
	}{
		{"defaults", Config{Authenticator: auth}, ""},
		{"a budget of one state", Config{Authenticator: auth, MaxBytes: MaxStateBytes}, ""},
		{"no authenticator", Config{}, "Config.Authenticator is required"},
		{"a budget below one state", Config{Authenticator: auth, MaxBytes: MaxStateBytes - 1}, "MaxBytes must be at least that"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if _, nerr := New(tt.cfg); (nerr == nil) != (err == nil) {
				t.Errorf("New: %v, Validate: %v; want both to pass or both to refuse", nerr, err)
			}
		})
	}
}
