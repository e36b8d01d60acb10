package contract

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
)

// Annotations of node mode, on the Deployment beside amf.io/standby (never on
// the pod template: changing them restarts no pod).
const (
	// AnnMode says who runs the pod's detection: ModeSidecar (the default,
	// also when absent) or ModeNode.
	AnnMode = "amf.io/mode"
	// AnnModel names the embedded model the node agent scores the pod with
	// in node mode (default DefaultModel). In sidecar mode the sidecar's
	// --model says it.
	AnnModel = "amf.io/model"
	// AnnProbe is the app-logic probe the node agent runs against the pod in
	// node mode, aimed at the pod's IP: "mqtt://:<port>" (an MQTT round
	// trip, as the sidecar's --probe-mqtt) or "tcp://:<port>". Absent: no
	// probe, the pod is healthy on its score alone.
	AnnProbe = "amf.io/probe"
	// AnnContainer names the broker container the node agent watches in
	// node mode, when the pod has more than one: default the only
	// container, else the one exposing a port named "mqtt".
	AnnContainer = "amf.io/container"
)

// Names a pod's containers and ports are known by: inject writes them, node
// mode and the admission policy read them.
const (
	// SidecarName is the sidecar's container name (a native sidecar: an
	// init container); node mode refuses a pod that has it.
	SidecarName = "amf-sidecar"
	// MQTTPortName is the port name that marks the broker container among
	// several.
	MQTTPortName = "mqtt"
)

// DefaultModel is the model node mode scores with when AnnModel is absent:
// the embedded default (infer/model.DefaultName, restated so this package
// links nothing).
const DefaultModel = "leadtime"

// Mode is who runs a pod's detection pipeline.
type Mode string

// The modes.
const (
	// ModeSidecar: the amf-sidecar in the pod (injected into the template).
	ModeSidecar Mode = "sidecar"
	// ModeNode: the node agent, for every opted-in pod on its node.
	ModeNode Mode = "node"
)

// ParseMode reads AnnMode from a Deployment's annotations: absent is
// ModeSidecar; anything but the two modes is an error naming the key.
func ParseMode(ann map[string]string) (Mode, error) {
	v, ok := ann[AnnMode]
	if !ok {
		return ModeSidecar, nil
	}
	switch m := Mode(v); m {
	case ModeSidecar, ModeNode:
		return m, nil
	}
	return "", fmt.Errorf("%s=%q: want %s or %s", AnnMode, v, ModeSidecar, ModeNode)
}

// Probe is an app-logic probe aimed at a pod (AnnProbe).
type Probe struct {
	Scheme string // "mqtt" or "tcp"
	Port   int
}

// ParseProbe reads AnnProbe. The host must be empty: the probe goes to the
// pod's own IP, never to an address the annotation names, so a workload
// cannot point the agent at another host.
func ParseProbe(v string) (Probe, error) {
	bad := func(why string) (Probe, error) {
		return Probe{}, fmt.Errorf("%s=%q: %s (e.g. mqtt://:1883)", AnnProbe, v, why)
	}
	u, err := url.Parse(v)
	if err != nil {
		return bad(err.Error())
	}
	if u.Scheme != "mqtt" && u.Scheme != "tcp" {
		return bad("want scheme mqtt or tcp")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return bad("want :<port>")
	}
	if host != "" {
		return bad("no host: the probe goes to the pod's IP")
	}
	if u.Path != "" || u.RawQuery != "" || u.User != nil {
		return bad("nothing but the port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return bad("port from 1 to 65535")
	}
	return Probe{Scheme: u.Scheme, Port: n}, nil
}
