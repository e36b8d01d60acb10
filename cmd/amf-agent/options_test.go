package main

import (
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// TestOptionsThatDoNotGoTogetherAreRefusedBeforeAnythingStarts: validate
// alone decides which command lines the agent runs, with a reason naming
// the flags; the combinations the manifests use pass.
func TestOptionsThatDoNotGoTogetherAreRefusedBeforeAnythingStarts(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string // in the error; "" passes
	}{
		{"defaults", nil, ""},
		{"the DaemonSet of manifests/base", []string{"--listen=0.0.0.0:1884", "--node-name=n1", "--actuate", "--liveness", "--liveness-advertise=10.0.0.5:1885",
			"--state-listen=0.0.0.0:1886", "--state-advertise=10.0.0.5:1886", "--state-peer-token=/var/run/secrets/amf.io/state-peer/token"}, ""},
		{"the node-mode overlay", []string{"--node-name=n1", "--actuate", "--node-mode", "--host-cgroup-root=/host/sys/fs/cgroup"}, ""},
		{"static tokens alone", []string{"--token-file=/t"}, ""},
		{"unknown log level", []string{"--log-level=loud"}, "--log-level"},
		{"node mode with static tokens", []string{"--node-mode", "--node-name=n1", "--token-file=/t"}, "--node-mode needs the Kubernetes API"},
		{"node mode without its node", []string{"--node-mode"}, "--node-mode needs --node-name"},
		{"cgroup roots without node mode", []string{"--host-cgroup-root=/h"}, "are for --node-mode"},
		{"kubelet root without node mode", []string{"--kubelet-cgroup-root=/kubelet"}, "are for --node-mode"},
		{"resume without actuation", []string{"--resume-on-start"}, "--resume-on-start needs --actuate"},
		{"actuation with static tokens", []string{"--actuate", "--token-file=/t"}, "--actuate needs the Kubernetes API"},
		{"static tokens and a kubeconfig", []string{"--token-file=/t", "--kubeconfig=/k"}, "--token-file excludes --kubeconfig"},
		{"static tokens and a node", []string{"--token-file=/t", "--node-name=n1"}, "--token-file excludes"},
		{"connkill with static tokens", []string{"--connkill-socket=/run/amf/connkill.sock", "--token-file=/t"}, "--connkill-socket needs the Kubernetes API"},
		{"connkill", []string{"--connkill-socket=/run/amf/connkill.sock", "--node-name=n1"}, ""},
		{"liveness without actuation", []string{"--liveness", "--node-name=n1", "--liveness-advertise=10.0.0.5:1885"}, "--liveness needs --actuate"},
		{"liveness without an address", []string{"--liveness", "--actuate", "--node-name=n1"}, "--liveness needs --liveness-advertise"},
		{"node mode at a negative interval", []string{"--node-mode", "--node-name=n1", "--interval=-1s"}, "sampling interval -1s is not positive"},
		{"node mode slower than the default model samples", []string{"--node-mode", "--node-name=n1", "--interval=10s"}, "slower than the model's sample_interval"},
		{"an interval without node mode is not node mode's", []string{"--interval=10s"}, ""},
		{"liveness on a bad port", []string{"--liveness", "--actuate", "--node-name=n1", "--liveness-advertise=10.0.0.5:0"}, "is not a TCP port"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("amf-agent", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o := addFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			level, err := o.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want == "" && level != slog.LevelInfo:
				t.Errorf("log level %v, want info", level)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}
