package brokerstate

import (
	"strings"
	"testing"
)

// Persistent turns the one persistence line of a configuration on, in
// DataDir, and refuses a configuration that says where or whether to keep
// its state other than once.
func TestPersistent(t *testing.T) {
	got, err := Persistent("listener 1883\npersistence false\nlog_dest stdout\n")
	if want := "listener 1883\npersistence true\npersistence_location " + DataDir + "/\nlog_dest stdout\n"; err != nil || got != want {
		t.Errorf("Persistent = %q, %v; want %q", got, err, want)
	}
	for _, conf := range []string{
		"listener 1883\n",
		"persistence false\npersistence true\n",
		"persistence true\npersistence_location /data/\n",
	} {
		if got, err := Persistent(conf); err == nil || !strings.HasPrefix(err.Error(), "brokerstate: ") {
			t.Errorf("Persistent(%q) = %q, %v; want it refused", conf, got, err)
		}
	}
}
