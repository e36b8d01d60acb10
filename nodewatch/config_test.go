package nodewatch

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"

	"github.com/amf-edge/amf/podsignal"
)

// TestValidateNamesWhatTheWatcherLacks: the clients, the node and the
// tracker are required; the interval and the rest have defaults.
func TestValidateNamesWhatTheWatcherLacks(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*Config)
		want string // in the error; "" passes
	}{
		{"complete, the interval defaulted", func(*Config) {}, ""},
		{"an interval of its own", func(c *Config) { c.Interval = 500 * time.Millisecond }, ""},
		{"no client", func(c *Config) { c.Client = nil }, "the Kubernetes clients are required"},
		{"no metadata client", func(c *Config) { c.Metadata = nil }, "the Kubernetes clients are required"},
		{"no node", func(c *Config) { c.NodeName = "" }, "the node name is required"},
		{"no tracker", func(c *Config) { c.Begin = nil }, "Begin (the tracker) is required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{
				Client:   fake.NewClientset(),
				Metadata: metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme()),
				NodeName: "n1",
				Begin:    func(podsignal.PodID) Session { return nil },
			}
			tt.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}
