package contract

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParsePolicy(t *testing.T) {
	def := DefaultGates()
	tests := []struct {
		name        string
		ann         map[string]string
		wantManaged bool
		wantErr     string // substring; "" = valid
		check       func(t *testing.T, p Policy)
	}{
		{"no standby annotation: not managed", map[string]string{"x": "y"}, false, "", nil},
		{"standby only: cold with the paper's gates", map[string]string{AnnStandby: "b"}, true, "", func(t *testing.T, p Policy) {
			if p.Redundancy != Cold || p.Gates != def || p.Standby != "b" {
				t.Errorf("policy %+v", p)
			}
		}},
		{"every override is read", map[string]string{
			AnnStandby: "b", AnnRedundancy: "hot", AnnThreshold: "0.7", AnnDebounce: "5", AnnReconfirm: "2",
			AnnHold: "2s", AnnReadyTimeout: "30s", AnnCooldown: "1m", AnnAbortDelay: "0s",
			AnnMemoryCeiling: "512Mi", AnnResizeTimeout: "5s", AnnSidecarGrace: "0s",
		}, true, "", func(t *testing.T, p Policy) {
			want := Gates{Threshold: 0.7, Debounce: 5, Reconfirm: 2, Hold: 2 * time.Second, ReadyTimeout: 30 * time.Second, Cooldown: time.Minute, ResizeTimeout: 5 * time.Second}
			if p.Redundancy != Hot || p.Gates != want || p.MemoryCeiling != 512<<20 {
				t.Errorf("policy %+v", p)
			}
		}},
		{"unknown redundancy is refused", map[string]string{AnnStandby: "b", AnnRedundancy: "warm"}, true, AnnRedundancy, nil},
		{"standby must be a name", map[string]string{AnnStandby: "B_b"}, true, AnnStandby, nil},
		{"standby cannot be itself", map[string]string{AnnStandby: "a"}, true, "own standby", nil},
		{"threshold outside (0,1] is refused", map[string]string{AnnStandby: "b", AnnThreshold: "1.5"}, true, AnnThreshold, nil},
		{"threshold NaN is refused", map[string]string{AnnStandby: "b", AnnThreshold: "NaN"}, true, AnnThreshold, nil},
		{"debounce zero is refused", map[string]string{AnnStandby: "b", AnnDebounce: "0"}, true, AnnDebounce, nil},
		{"hold not a duration is refused", map[string]string{AnnStandby: "b", AnnHold: "15"}, true, AnnHold, nil},
		{"ready timeout zero is refused", map[string]string{AnnStandby: "b", AnnReadyTimeout: "0s"}, true, AnnReadyTimeout, nil},
		{"no memory ceiling: no resize", map[string]string{AnnStandby: "b"}, true, "", func(t *testing.T, p Policy) {
			if p.MemoryCeiling != 0 {
				t.Errorf("ceiling %d", p.MemoryCeiling)
			}
		}},
		{"memory ceiling in decimal units is refused", map[string]string{AnnStandby: "b", AnnMemoryCeiling: "512M"}, true, AnnMemoryCeiling, nil},
		{"memory ceiling zero is refused", map[string]string{AnnStandby: "b", AnnMemoryCeiling: "0"}, true, "must be positive", nil},
		{"a sidecar grace beyond five minutes is refused", map[string]string{AnnStandby: "b", AnnSidecarGrace: "6m"}, true, AnnSidecarGrace, nil},
		{"resize timeout zero is refused", map[string]string{AnnStandby: "b", AnnResizeTimeout: "0s"}, true, AnnResizeTimeout, nil},
		{"every bad key is named", map[string]string{AnnStandby: "b", AnnDebounce: "x", AnnCooldown: "-1s"}, true, AnnCooldown, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, managed, err := ParsePolicy("a", tt.ann)
			if managed != tt.wantManaged {
				t.Errorf("managed %v, want %v", managed, tt.wantManaged)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("error %v", err)
				}
			} else {
				if err == nil || !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want ErrInvalidPolicy mentioning %q", err, tt.wantErr)
				}
			}
			if tt.check != nil {
				tt.check(t, p)
			}
		})
	}
}
