// Package node is test infrastructure: a lab "kubelet" that registers a Node with
// a real Kubernetes API server (see lab/controlplane) and runs the pods bound to
// it as real local processes in real cgroups, so that the AMF sidecar, agent and
// broker can be exercised end to end on one machine. Product code never imports it.
//
// What it does, as far as the lab needs it:
//
//   - Node: registers the Node (labels, capacity, Ready condition, InternalIP) and
//     renews its Lease in kube-node-lease every 10 s, so the node-lifecycle
//     controller keeps it Ready. It must not carry the kwok.x-k8s.io/node
//     annotation (kwok would manage it).
//   - Pods: an informer on pods with spec.nodeName = Config.Name. Each pod gets
//     cgroups in the kubelet's cgroupfs layout,
//     <controller>/kubepods[/burstable|/besteffort]/pod<uid>/<64-hex container id>,
//     in every cgroup v1 hierarchy of the machine (named and unified hierarchies
//     are skipped), with memory, CPU quota and CPU shares from the resources as
//     the kubelet sets them. There is no pause container, so the AMF sidecar's
//     discovery (sidecar/cgroup.FindContainer) finds exactly the broker once it
//     has excluded its own container. Init containers run in order, a native
//     sidecar (restartPolicy Always) until it has started (startup probe
//     passed), a regular one to completion; then the containers start.
//   - Containers are processes of Image.Entrypoint/Cmd (mapped from the image
//     repository in Config.Images) or command/args, with the Kubernetes rules
//     for env (fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef,
//     envFrom), $(VAR) expansion, workingDir and runAsUser/runAsGroup. Each runs
//     in its own process group with stdout and stderr in
//     <StateDir>/pods/<ns>_<name>_<uid>/<container>/<restartCount>.log.
//   - Joining the cgroups before the program runs: cgroup v1 lets a single
//     thread change cgroups (the tasks file). A goroutine locks itself to an OS
//     thread, moves that thread into the container's cgroups, forks the child
//     there (a child inherits the cgroups of the thread that forks it), moves the
//     thread back, and keeps it until the child has exited. So the child is
//     charged to its container from its first instruction, whatever program it
//     is, without a shim or ptrace; and since the forking thread lives as long
//     as the child, the child's parent-death signal (SIGKILL) fires only when the
//     node's process dies, so a crashed test leaves no broker behind (only
//     empty pod cgroups, which a node that runs the same pod again removes).
//   - Volumes: configMap, secret, emptyDir, hostPath, downwardAPI and projected
//     (serviceAccountToken with TokenRequest, audience, expiry and a binding to
//     the pod, refreshed at 80 % of its lifetime; configMap; secret;
//     downwardAPI). There are no mount namespaces: a container sees a volume at
//     its mountPath by path rewriting only. In command, args, env values and
//     workingDir, each occurrence of a mountPath (at the start of the string or
//     right after '=', followed by '/' or the end) is replaced by the volume's
//     directory on the host. Programs that hard-code paths, or read them from
//     files (a mosquitto.conf naming /mosquitto/data), are not covered: give
//     such paths on the command line or keep them host paths. Files are written
//     once when the pod starts (configMap and secret updates are not followed),
//     sizeLimit is not enforced, readOnly is not enforced.
//   - Networking: every pod shares the host's network namespace, like
//     hostNetwork: podIP = hostIP = Config.HostIP, and two pods that listen on
//     the same port collide. Give each broker and sidecar its own ports.
//   - Probes: startup, readiness and liveness with exec, tcpSocket and httpGet
//     (gRPC probes always fail), with their delays, periods, timeouts and
//     thresholds. A liveness or startup failure kills and restarts the container.
//   - Status: pods/status is patched with a strategic merge patch (never an
//     update), only when what the node owns changed: phase, IPs, startTime, the
//     conditions PodReadyToStartContainers, Initialized, ContainersReady and
//     Ready, and the container statuses. Other conditions (the readiness gate
//     amf.io/healthy that the AMF agent patches) are never written, but Ready is
//     re-evaluated when they change.
//   - OOM: Kubernetes ≥ 1.28 sets memory.oom.group, so an OOM kill ends the
//     whole container. On cgroup v1 the node waits for the kernel's OOM
//     notification (cgroup.event_control + an eventfd on memory.oom_control),
//     confirms it by the oom_kill counter, kills every process of the container
//     and reports terminated reason OOMKilled, exit code 137.
//   - Restarts follow restartPolicy with the kubelet's crash-loop back-off (see
//     Backoff): at once the first time, then 10 s, 20 s, 40 s ... up to 5 min,
//     reset after 10 min of running; meanwhile the status says waiting
//     CrashLoopBackOff.
//   - Deletion: SIGTERM to the containers' process groups, SIGKILL after the
//     grace period, native sidecars after the containers in reverse order, then
//     every process left in the cgroups (Exec'd ones included) is killed, the
//     cgroups are removed and the pod is deleted with grace period 0 and a UID
//     precondition. When Run's context ends, every pod is stopped the same way
//     but left in the API.
//
// What it does not do: cgroup v2 (New fails), images (Config.Images maps them to
// local programs; an unmapped image stays waiting ErrImagePull), mount, PID,
// user or network namespaces, capabilities, seccomp, readOnlyRootFilesystem,
// allowPrivilegeEscalation, Services' environment variables, volumes other than
// the ones above (the pod stays ContainerCreating), changes to a running pod's
// spec (a new image is ignored), in-place resize, ephemeral containers,
// pod-level resources, image users (runAsNonRoot needs runAsUser), logs and
// exec through the API server (use the log files and Node.Exec).
//
// Events (Node.Subscribe) carry the exact time of each container start, exit,
// OOM kill, back-off, readiness change and stop, for measuring outages.
//
// The node needs root and writes under /sys/fs/cgroup/*/kubepods; it never
// removes kubepods itself or its QoS children (another node of the same machine
// may use them), only the pod cgroups it made. StateDir and its parents must be
// traversable by the users the pods run as (runAsUser).
package node
