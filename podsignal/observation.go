package podsignal

import "time"

// PodID names one pod: the identity a sidecar proves to the agent and the
// subject of its signals.
type PodID struct {
	Namespace string
	Pod       string
}

// String returns "<namespace>/<pod>", the form used in usernames, client
// identifiers, token files and logs.
func (id PodID) String() string { return id.Namespace + "/" + id.Pod }

// Topic returns the only topic the pod may publish to.
func (id PodID) Topic() string { return Topic(id.Namespace, id.Pod) }

// CommandTopic is the pod's command topic.
func (id PodID) CommandTopic() string { return CommandTopic(id.Namespace, id.Pod) }

// Source says how the agent learned a pod's state.
type Source string

// The sources of an observation.
const (
	SourcePublish    Source = "publish"    // the sidecar published a signal
	SourceWill       Source = "will"       // the broker published the sidecar's Last Will
	SourceDisconnect Source = "disconnect" // the broker saw the sidecar's session end
	// SourceNode: the agent's own pipeline for the pod (node mode) gave the
	// message; no sidecar, no MQTT.
	SourceNode Source = "node"
)

// Observation is one accepted observation of a pod by the node agent: a
// signal (a sidecar's, or in node mode the agent's own pipeline's), a Last
// Will, or the end of its session. The agent's tracker hands
// it as it is to every subscriber, the actuator among them. Message and the
// values it points to are shared and must not be modified.
type Observation struct {
	PodID
	State      State // the pod's state after the observation
	Previous   State // the pod's state before it; "" if none
	Transition bool  // State != Previous
	Source     Source
	Message    *Message // nil for SourceDisconnect
	Received   time.Time
	Session    uint64
	// Missed counts the observations this subscriber lost to a full buffer
	// since the previous delivery.
	Missed uint64
}

// Probability is the model's score the observation carries; nil without one.
func (o *Observation) Probability() *float64 {
	if o.Message == nil {
		return nil
	}
	return o.Message.Probability
}

// Explanation is what drove the score the observation carries, when it is
// anomalous; "" otherwise.
func (o *Observation) Explanation() string {
	if o.Message == nil {
		return ""
	}
	return o.Message.Explanation
}
