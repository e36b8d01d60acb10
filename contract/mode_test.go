package contract

import (
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		want    Mode
		wantErr bool
	}{
		{"absent is sidecar", map[string]string{AnnStandby: "b"}, ModeSidecar, false},
		{"sidecar", map[string]string{AnnMode: "sidecar"}, ModeSidecar, false},
		{"node", map[string]string{AnnMode: "node"}, ModeNode, false},
		{"other values are refused", map[string]string{AnnMode: "Node"}, "", true},
		{"empty is refused", map[string]string{AnnMode: ""}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMode(tt.ann)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseMode = %q, %v; want %q, error %v", got, err, tt.want, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), AnnMode) {
				t.Errorf("error %q does not name %s", err, AnnMode)
			}
		})
	}
}

func TestParseProbe(t *testing.T) {
	tests := []struct {
		in      string
		want    Probe
		wantErr string
	}{
		{"mqtt://:1883", Probe{"mqtt", 1883}, ""},
		{"tcp://:8080", Probe{"tcp", 8080}, ""},
		{"mqtt://10.0.0.1:1883", Probe{}, "no host"},
		{"mqtt://localhost:1883", Probe{}, "no host"},
		{"http://:80", Probe{}, "scheme"},
		{"mqtt://:0", Probe{}, "port"},
		{"mqtt://:70000", Probe{}, "port"},
		{"mqtt://", Probe{}, "port"},
		{"mqtt://:1883/topic", Probe{}, "nothing but the port"},
		{"mqtt://u:p@:1883", Probe{}, "nothing but the port"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseProbe(tt.in)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseProbe = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), AnnProbe) {
				t.Fatalf("ParseProbe error %v, want one naming %s and %q", err, AnnProbe, tt.wantErr)
			}
		})
	}
}
