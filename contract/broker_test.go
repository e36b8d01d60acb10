package contract

import (
	"strings"
	"testing"
)

func TestCheckBrokerURL(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"tcp://127.0.0.1:1883", ""},
		{"ssl://127.0.0.1:8883", ""},
		{"ws://localhost:9001/mqtt", ""},
		{"not a url", "scheme must be one of"},
		{"foo://bar", "scheme must be one of"},
		{"tcp://", "has no host"},
		{"tcp://[::1", "missing ']'"},
	} {
		t.Run(tt.in, func(t *testing.T) {
			err := CheckBrokerURL(tt.in)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("CheckBrokerURL(%q) = %v, want %q", tt.in, err, tt.want)
			}
		})
	}
}
