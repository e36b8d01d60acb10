// Package agent is the node agent's control plane: an embedded MQTT broker
// (github.com/mochi-mqtt/server/v2) that receives the health signals of the
// sidecars on its node, proves who sent each one, and keeps the latest state of
// every pod for the decision logic.
//
// The broker is node-local and carries control traffic only; it is never the
// data-plane broker the workloads serve. In a pod it listens on the node's host
// port (the DaemonSet maps hostPort 1884 to it and the agent listens on
// 0.0.0.0:1884 inside the pod; sidecars dial status.hostIP:1884); outside
// Kubernetes and in tests it defaults to 127.0.0.1:1884.
//
// # Admission
//
// The listener is reachable by anything that reaches the node, so it keeps
// the connections that have not authenticated in a pool of their own
// (Config.MaxPending, MaxPendingPerSource; CONNECT within ConnectTimeout)
// apart from the sessions (MaxClients), evicts an idle connection of the
// source holding the most when that pool is full, and holds one session
// per pod: a pod's new session replaces its older one (type admission says
// why). Refusals and evictions are counted by reason in
// amf_agent_connections_refused_total and logged sampled.
//
// # What a sidecar must send
//
// The agent refuses a connection unless every rule holds, and counts and logs
// each refusal by reason (metric amf_agent_connections_refused_total):
//
//   - protocol MQTT 3.1.1 or 5;
//   - password: the token. In Kubernetes, a projected ServiceAccount token with
//     audience "amf-agent" bound to the sidecar's pod (verified with a
//     TokenReview); outside Kubernetes, a token of the static token file;
//   - username: "<namespace>/<pod>", equal to the identity the token proves. MQTT
//     3.1.1 cannot send a password without a username, so the username is
//     required rather than ignored, and it must match so a misconfigured sidecar
//     fails loudly at connect instead of publishing under a surprising name;
//   - client identifier: "<namespace>/<pod>" or "<namespace>/<pod>/<anything>".
//     MQTT lets a new connection take over the session of any client with the
//     same identifier; tying identifiers to the identity stops one pod from
//     kicking another pod's sidecar off (which would fire its Last Will);
//   - keepalive between 1 s and Config.MaxKeepalive (60 s by default): without
//     one, a frozen sidecar would never be noticed. MQTT 5 clients asking for 0
//     or more are given the maximum (server keepalive) instead of being refused;
//   - a Last Will, when present, on the pod's own health topic, undelayed, with
//     a valid payload of state "gone".
//
// An authenticated client may publish only to its own topic,
// podsignal.Topic(namespace, pod), and subscribe only to that same topic (to read
// back its own retained state). Anything else is an ACL denial: a QoS 0 publish
// is dropped; a QoS 1 publish gets PUBACK 0x87 (not authorized) from MQTT 5,
// while an MQTT 3.1.1 client, whose protocol has no negative acknowledgement,
// is disconnected (and its own pod is then gone); a subscription gets a failure
// return code. Publishes mochi itself deems invalid ($SYS/…, wildcards) are
// answered the same way instead of vanishing; a wildcard in a topic name
// is a protocol error that closes the connection (MQTT 5: DISCONNECT 0x90).
// Payloads that podsignal.Decode refuses (checked as bytes first: UTF-8, no
// unpaired surrogate escape) are neither retained, forwarded nor recorded:
// MQTT 5 QoS 1 publishers get PUBACK 0x99 (payload format invalid), others
// a plain acknowledgement, which MQTT 3.1.1 allows for a refused publish,
// so that a bad message neither is resent forever nor makes its pod read as
// gone. A packet above MaxPacketBytes closes the connection.
//
// # What the agent keeps
//
// The Tracker holds, per pod, the latest accepted state and message, whether a
// session is connected, and a short history of transitions. A run of a sidecar
// is one MQTT session: within a session a message whose seq is not greater than
// the last accepted one is a duplicate (QoS 1 redelivery, a replay) and is
// ignored; a new session starts a new run whose seq may start anywhere, because
// a restarted sidecar counts from zero again.
//
// A pod becomes gone by its Last Will, or by the broker seeing its session end:
// the end of a session marks the pod gone unless its last state was stopping
// (an orderly shutdown). Wills and disconnects of a session that a newer session
// of the same pod has replaced are ignored, so a reconnecting sidecar is not
// reported gone by the connection it replaced. Neither is recorded while the
// agent itself shuts down: the pods are not gone, the agent is.
//
// In node mode (package nodewatch) the agent runs a pod's pipeline itself:
// Tracker.BeginLocal opens a session without a connection, whose messages
// are recorded as a sidecar's are, with source node (podsignal.SourceNode); its
// End is the session's end.
//
// Each accepted observation becomes a podsignal.Observation delivered to the
// subscribers of Tracker.Subscribe, and each transition (a change of state) writes one JSON
// log line with message "transition".
//
// This package only observes: it never computes anomaly scores and never
// acts on the cluster. Actuation (package actuate) subscribes to its
// events; Config.ObserveOnly (flag --observe-only) turns it into a dry run.
package agent
