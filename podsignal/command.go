package podsignal

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// A Command goes the other way: from the node agent to one pod's sidecar,
// retained on the pod's command topic, which the sidecar alone may
// subscribe to. The only command is the fence (DESIGN.md, "Losing a whole
// node"): an agent cut off from the API server and from every guard of its
// node tells the sidecars of its guarded primaries to pause their brokers,
// since a guard may be taking over; it lifts the fence once the API server
// says the pod is still the primary. The newest command is the sidecar's
// state: retained, it reaches a sidecar that reconnects.
type Command struct {
	Version   int       `json:"v"`
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod"`
	Fence     bool      `json:"fence"` // true: pause the broker; false: resume it
	Time      time.Time `json:"time"`  // when the agent decided, on the agent's clock
	Reason    string    `json:"reason,omitempty"`
}

// The commands by name, as metrics and logs spell them (Command.Name).
const (
	CommandFence = "fence" // pause the broker
	CommandLift  = "lift"  // resume it
)

// Name is the command's name: CommandFence or CommandLift.
func (c Command) Name() string {
	if c.Fence {
		return CommandFence
	}
	return CommandLift
}

// MaxCommandBytes bounds a command payload: a command carries two names, a
// time and a short reason.
const MaxCommandBytes = 1 << 10

// CommandTopic returns the command topic of a pod.
func CommandTopic(namespace, pod string) string {
	return TopicPrefix + namespace + "/" + pod + "/command"
}

// ErrCommand is wrapped by every refusal of DecodeCommand.
var ErrCommand = errors.New("signal: invalid command")

// Validate checks c against the contract.
func (c *Command) Validate() error {
	if c.Version != Version {
		return fmt.Errorf("%w: version %d, want %d", ErrCommand, c.Version, Version)
	}
	if err := ValidateNames(c.Namespace, c.Pod); err != nil {
		return fmt.Errorf("%w: %v", ErrCommand, err)
	}
	if c.Time.IsZero() {
		return fmt.Errorf("%w: no time", ErrCommand)
	}
	if len(c.Reason) > MaxReasonBytes || !printable(c.Reason) {
		return fmt.Errorf("%w: reason longer than %d bytes or not printable", ErrCommand, MaxReasonBytes)
	}
	return nil
}

// EncodeCommand validates c and returns its payload.
func EncodeCommand(c *Command) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("signal: encode command: %w", err)
	}
	if len(b) > MaxCommandBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrCommand, len(b), MaxCommandBytes)
	}
	return b, nil
}

// DecodeCommand parses and validates a payload received on topic: unknown
// or missing fields, oversize payloads and a command naming another pod
// than its topic are refused.
func DecodeCommand(topic string, payload []byte) (Command, error) {
	if len(payload) > MaxCommandBytes {
		return Command{}, fmt.Errorf("%w: %d bytes on %s, more than %d", ErrCommand, len(payload), truncate(topic), MaxCommandBytes)
	}
	rest, ok := strings.CutPrefix(topic, TopicPrefix)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || parts[2] != "command" {
		return Command{}, fmt.Errorf("%w: %q is not %s<namespace>/<pod>/command", ErrCommand, truncate(topic), TopicPrefix)
	}
	var raw struct {
		Version   *int       `json:"v"`
		Namespace *string    `json:"namespace"`
		Pod       *string    `json:"pod"`
		Fence     *bool      `json:"fence"`
		Time      *time.Time `json:"time"`
		Reason    string     `json:"reason"`
	}
	if err := decodeStrict(payload, &raw); err != nil {
		return Command{}, fmt.Errorf("%w: %v", ErrCommand, err)
	}
	if raw.Version == nil || raw.Namespace == nil || raw.Pod == nil || raw.Fence == nil || raw.Time == nil {
		return Command{}, fmt.Errorf("%w: v, namespace, pod, fence and time are required", ErrCommand)
	}
	c := Command{Version: *raw.Version, Namespace: *raw.Namespace, Pod: *raw.Pod, Fence: *raw.Fence, Time: *raw.Time, Reason: raw.Reason}
	if err := c.Validate(); err != nil {
		return Command{}, err
	}
	if c.Namespace != parts[0] || c.Pod != parts[1] {
		return Command{}, fmt.Errorf("%w: topic %s/%s, payload %s/%s", ErrCommand, truncate(parts[0]), truncate(parts[1]), c.Namespace, c.Pod)
	}
	return c, nil
}
