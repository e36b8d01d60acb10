// Package nodewatch is node mode: the node agent runs the detection
// pipeline (a detect.Runner, the sidecar's loop) itself for every opted-in pod bound to its
// node, instead of a sidecar in each pod, and hands each pipeline's messages
// to the agent's tracker as observations of that pod (podsignal.SourceNode), so
// the same actuator and gates act on them.
//
// # Which pods
//
// One pod informer with the field selector spec.nodeName=<node> (the API
// server filters: the agent never receives another node's pods), and one
// metadata-only informer on Deployments (names, annotations, owner
// references; never a pod template). A pod is watched while:
//
//   - it is bound to this node (checked again here), is not being deleted,
//     and its phase is Running;
//   - its controller is a ReplicaSet whose controller is a Deployment that
//     carries amf.io/mode=node. The ReplicaSet is read with one GET per
//     ReplicaSet (cached by UID: a ReplicaSet's owner is set once), the
//     right the actuator already has; the Deployment comes from the
//     metadata informer, so opting in or out (changing the annotation,
//     which restarts no pod) starts or stops the pipelines at once;
//   - it does not carry the AMF sidecar: a pod that opts into node mode and
//     has the sidecar too would be watched twice and signal twice, so it is
//     refused with a Warning Event (reason NodeModeRefused) and gets no
//     pipeline (its sidecar's own signals are taken as in sidecar mode);
//   - its broker container is known (amf.io/container, else the only
//     container, else the one exposing a port named mqtt) and its model
//     (amf.io/model, default contract.DefaultModel) is embedded in the
//     agent; otherwise a Warning Event says what is wrong.
//
// The two informers are client-go's, on Config.Client and Config.Metadata
// (fed client-go's fakes in the tests); the calls nodewatch makes itself,
// the ReplicaSet GET and the Events, go through Cluster, its part of the
// agent's one seam to the API server (package cluster), whose fake
// (clusterfake) the tests share with the actuator's.
//
// A pipeline starts when the informer delivers the pod (or the Deployment)
// change that makes it watched, and stops when one makes it not: the
// pipeline's last message is then stopping (as a sidecar's on SIGTERM),
// never gone, so a pod deleted by a scale-down or a rollout fails nothing
// over. When the agent itself stops, the pipelines end without a message:
// the pods are not going, the agent is.
//
// # One pod's pipeline
//
// The broker container is found with the sidecar's discovery code
// (cgroup.FindContainer, by the container ID the pod status gives) under
// the host's cgroup tree (mounted read-only at a path given with
// cgroup.WithCgroupRoot when the agent runs in a pod) and sampled every
// Interval (1 s). Its end is pushed, not polled: cgroup.WatchExit on the
// container's first process (a pidfd; needs the host's PID namespace) and
// cgroup.WatchOOM on its memory cgroup (v2: inotify on memory.events; v1:
// cgroup.event_control, which needs a writable cgroup mount) make the pod
// unhealthy the moment the kernel reports it, without waiting for the next
// sample. A restarted container (new ID in the pod status) becomes the
// target again; its first sample says the pod is back.
package nodewatch
