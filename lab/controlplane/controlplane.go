package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	watchtools "k8s.io/client-go/tools/watch"
)

// Options configures Start. The zero value is one fake node and the defaults below.
type Options struct {
	// Nodes is the number of kwok fake nodes, named kwok-node-0, kwok-node-1, ...
	// (default 1). More can be added later with AddNode.
	Nodes int
	// NoFakeNodes runs no kwok and makes no fake node: a cluster of real
	// nodes only (lab/kubenode), where a DaemonSet must not get fake pods.
	NoFakeNodes bool
	// BinDir overrides where the binaries are (default: BinDir()).
	BinDir string
	// StartTimeout bounds Start when ctx has no deadline (default 2 minutes).
	StartTimeout time.Duration
	// ServingIPs are more addresses the API server's certificate is valid for:
	// where lab nodes reach it (see lab/kubenode).
	ServingIPs []net.IP
	// Extra command-line flags, appended to each component's own.
	APIServerFlags, ControllerManagerFlags, SchedulerFlags, KwokFlags []string
}

// ServiceAccountIssuer is the issuer (and default audience) of ServiceAccount tokens.
const ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// ControlPlane is a running control plane. Its methods are safe for concurrent use.
type ControlPlane struct {
	// Dir is the temporary folder: pki/, etcd/, logs/<component>.log, kubeconfigs.
	Dir string
	// BinDir is where the binaries came from.
	BinDir string
	// Host is the API server's URL (https://127.0.0.1:<port>).
	Host string
	// Kubeconfig is the path of an admin kubeconfig (for KubectlPath and others).
	Kubeconfig string
	// KubectlPath is the kubectl built with the control plane (never the one on PATH).
	KubectlPath string
	// Version is the API server's gitVersion, e.g. v1.36.5.
	Version string
	// Nodes are the names of the fake nodes created by Start.
	Nodes []string
	// StartDuration is how long Start took, from the first process to Ready nodes.
	StartDuration time.Duration

	logf   func(format string, args ...any)
	opts   Options
	pki    *pki
	tokens struct{ admin, kcm, scheduler, kwok string }
	ports  struct{ etcd, etcdPeer, apiserver, kcm, scheduler, kwok int }
	admin  *rest.Config
	client kubernetes.Interface
	phases string // how long each step of the start took

	mu                                  sync.Mutex
	etcd, apiserver, kcm, scheduler, kw *process
	stopped                             bool
}

// TB is what Start needs of a test; testing.TB has it. An interface of its
// own keeps package testing out of the programs that link this package
// (amf-lab), where it would register test flags and weigh the binary.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
	Failed() bool
	TempDir() string
}

// Start starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// kwok, and returns once the cluster can run pods: API server ready, every fake
// node Ready, "default" ServiceAccount created. ctx bounds the start only; the
// processes live until Stop, which tb.Cleanup calls (printing the components' logs
// if the test failed). Missing binaries skip the test (fail it with AMF_REQUIRE_K8S=1).
func Start(ctx context.Context, tb TB, opts Options) (*ControlPlane, error) {
	tb.Helper()
	if opts.BinDir == "" {
		opts.BinDir = binDirOrSkip(tb)
	}
	// The folder first: cleanups run last-in first-out, so its removal
	// comes after the logs are printed.
	dir := tb.TempDir()
	var cp *ControlPlane
	tb.Cleanup(func() {
		if cp == nil {
			return
		}
		if tb.Failed() {
			cp.DumpLogs()
		}
		cp.Stop()
	})
	var err error
	cp, err = Launch(ctx, dir, opts, tb.Logf)
	return cp, err
}

// binDirOrSkip is the binaries' folder; when they are missing it skips tb,
// or fails it with AMF_REQUIRE_K8S=1. Under -short it skips tb.
func binDirOrSkip(tb TB) string {
	tb.Helper()
	// -short is for the quick tests, and a control plane takes seconds to
	// start, its tests minutes. Read from the flag rather than package
	// testing, which the lab's binaries must not link.
	if f := flag.Lookup("test.short"); f != nil && f.Value.String() == "true" {
		tb.Skipf("starts a Kubernetes control plane: not with -short")
	}
	bin, err := BinDir()
	if err == nil {
		err = checkBinDir(bin)
	}
	if err != nil {
		if os.Getenv(EnvRequire) == "1" {
			tb.Fatalf("Kubernetes control plane not built (%v) and %s=1: run make k8s", err, EnvRequire)
		}
		tb.Skipf("Kubernetes control plane not built (%v): run make k8s", err)
	}
	return bin
}

// Launch is Start for programs (the lab's experiment runner): the components run
// in dir (which must exist) and log through logf; the caller calls Stop. Missing
// binaries are an error saying to run make k8s.
func Launch(ctx context.Context, dir string, opts Options, logf func(format string, args ...any)) (*ControlPlane, error) {
	bin := opts.BinDir
	var err error
	if bin == "" {
		bin, err = BinDir()
	}
	if err == nil {
		err = checkBinDir(bin)
	}
	if err != nil {
		return nil, fmt.Errorf("the Kubernetes control plane is not built (%w): run make k8s", err)
	}
	if opts.Nodes <= 0 {
		opts.Nodes = 1
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 2 * time.Minute
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.StartTimeout)
		defer cancel()
	}

	cp := &ControlPlane{Dir: dir, BinDir: bin, KubectlPath: filepath.Join(bin, "kubectl"), logf: logf, opts: opts}
	cp.Kubeconfig = filepath.Join(cp.Dir, "admin.kubeconfig")
	for _, d := range []string{"logs", "home"} {
		if err := os.MkdirAll(filepath.Join(cp.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if cp.pki, err = writePKI(filepath.Join(cp.Dir, "pki"), opts.ServingIPs); err != nil {
		return nil, fmt.Errorf("controlplane: keys: %w", err)
	}
	cp.tokens.admin, cp.tokens.kcm, cp.tokens.scheduler, cp.tokens.kwok = randomToken(), randomToken(), randomToken(), randomToken()

	t0 := time.Now()
	for attempt := 1; ; attempt++ {
		err = cp.start(ctx)
		if err == nil {
			break
		}
		cp.stopProcesses()
		if attempt < 3 && (errors.Is(err, errPortTaken) || errors.Is(err, errKwokRace)) && ctx.Err() == nil {
			logf("controlplane: %v; retrying with other ports", firstLine(err))
			continue
		}
		cp.DumpLogs()
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	cp.StartDuration = time.Since(t0)
	logf("controlplane: %s ready in %v (%s)", cp.Version, cp.StartDuration.Round(time.Millisecond), cp.phases)
	return cp, nil
}

func (cp *ControlPlane) start(ctx context.Context) (err error) {
	cp.phases = ""
	t0 := time.Now()
	lap := func(what string) {
		if cp.phases != "" {
			cp.phases += ", "
		}
		cp.phases += what + " " + time.Since(t0).Round(time.Millisecond).String()
		t0 = time.Now()
	}
	ports, err := freePorts(6)
	if err != nil {
		return err
	}
	p := &cp.ports
	p.etcd, p.etcdPeer, p.apiserver, p.kcm, p.scheduler, p.kwok = ports[0], ports[1], ports[2], ports[3], ports[4], ports[5]
	cp.Host = "https://127.0.0.1:" + itoa(p.apiserver)
	cp.admin = &rest.Config{
		Host:            cp.Host,
		BearerToken:     cp.tokens.admin,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.pki.caPEM},
		QPS:             100,
		Burst:           200,
	}
	if cp.client, err = kubernetes.NewForConfig(cp.admin); err != nil {
		return err
	}
	if err := cp.writeConfigs(); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(cp.Dir, "etcd")); err != nil { // fresh on a retry
		return err
	}

	// etcd and the API server together (the API server retries etcd), the rest
	// once the API server is ready, so they do not start with backoffs.
	cp.mu.Lock()
	cp.etcd = cp.newProcess("etcd", cp.etcdArgs())
	cp.apiserver = cp.newProcess("kube-apiserver", cp.apiserverArgs())
	cp.mu.Unlock()
	for _, pr := range []*process{cp.etcd, cp.apiserver} {
		if err := pr.start(); err != nil {
			return err
		}
	}
	wctx, cancel := untilExit(ctx, cp.etcd, cp.apiserver)
	err = cp.waitAPIServer(wctx)
	cancel()
	if err != nil {
		return err
	}
	lap("apiserver")
	cp.mu.Lock()
	cp.kcm = cp.newProcess("kube-controller-manager", cp.kcmArgs())
	cp.scheduler = cp.newProcess("kube-scheduler", cp.schedulerArgs())
	procs := []*process{cp.kcm, cp.scheduler}
	if !cp.opts.NoFakeNodes {
		cp.kw = cp.newProcess("kwok", cp.kwokArgs())
		procs = append(procs, cp.kw)
	}
	cp.mu.Unlock()
	for _, pr := range procs {
		if err := pr.start(); err != nil {
			return err
		}
	}
	ctx, cancel = untilExit(ctx, append([]*process{cp.etcd, cp.apiserver}, procs...)...)
	defer cancel()
	defer func() {
		// A component's exit is the cause of whatever failed after it, also
		// where the wait did not say so: Start retries on some exits.
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", err, cause)
		}
	}()

	v, err := cp.client.Discovery().ServerVersion()
	if err != nil {
		return err
	}
	cp.Version = v.GitVersion
	cp.Nodes = nil
	fake := cp.opts.Nodes
	if cp.opts.NoFakeNodes {
		fake = 0
	}
	for i := range fake {
		name := fmt.Sprintf("kwok-node-%d", i)
		if err := cp.createNode(ctx, name); err != nil {
			return err
		}
		cp.Nodes = append(cp.Nodes, name)
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // self-signed, loopback
	defer insecure.CloseIdleConnections()
	checks := []struct {
		what string
		url  string
	}{
		{"kube-controller-manager /healthz", "https://127.0.0.1:" + itoa(p.kcm) + "/healthz"},
		{"kube-scheduler /healthz", "https://127.0.0.1:" + itoa(p.scheduler) + "/healthz"},
	}
	if cp.kw != nil {
		checks = append(checks, struct{ what, url string }{"kwok /healthz", "http://127.0.0.1:" + itoa(p.kwok) + "/healthz"})
	}
	for _, c := range checks {
		if err := poll(ctx, c.what, func(ctx context.Context) error { return get(ctx, insecure, c.url, "") }); err != nil {
			return err
		}
	}
	lap("components")
	if err := cp.waitNodesReady(ctx, cp.Nodes...); err != nil {
		return err
	}
	lap("nodes")
	// The ServiceAccount admission plugin refuses pods until their namespace has
	// its "default" ServiceAccount, made by the controller manager.
	if err := cp.WaitServiceAccount(ctx, metav1.NamespaceDefault, "default"); err != nil {
		return err
	}
	lap("serviceaccount")
	return nil
}

func (cp *ControlPlane) waitAPIServer(ctx context.Context) error {
	hc, err := rest.HTTPClientFor(cp.admin)
	if err != nil {
		return err
	}
	return poll(ctx, "kube-apiserver /readyz", func(ctx context.Context) error {
		return get(ctx, hc, cp.Host+"/readyz", cp.tokens.admin)
	})
}

// untilExit returns a context cancelled, with the exit as its cause, when one of
// the processes exits.
func untilExit(ctx context.Context, procs ...*process) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	for _, p := range procs {
		go func() {
			select {
			case <-p.done:
				cancel(p.exitError())
			case <-ctx.Done():
			}
		}()
	}
	return ctx, func() { cancel(nil) }
}

func get(ctx context.Context, hc *http.Client, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func (cp *ControlPlane) newProcess(name string, args []string) *process {
	return &process{
		name:    name,
		path:    filepath.Join(cp.BinDir, name),
		args:    args,
		env:     childEnv(filepath.Join(cp.Dir, "home")),
		logPath: filepath.Join(cp.Dir, "logs", name+".log"),
	}
}

func (cp *ControlPlane) path(elem ...string) string {
	return filepath.Join(append([]string{cp.Dir}, elem...)...)
}

func (cp *ControlPlane) writeConfigs() error {
	tokens := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,system:kube-controller-manager,kube-controller-manager\n"+
		"%s,system:kube-scheduler,kube-scheduler\n%s,kwok-controller,kwok-controller,\"system:masters\"\n",
		cp.tokens.admin, cp.tokens.kcm, cp.tokens.scheduler, cp.tokens.kwok)
	if err := os.WriteFile(cp.path("pki", "tokens.csv"), []byte(tokens), 0o600); err != nil {
		return err
	}
	for _, k := range []struct{ file, user, token string }{
		{"admin.kubeconfig", "admin", cp.tokens.admin},
		{"kube-controller-manager.kubeconfig", "kube-controller-manager", cp.tokens.kcm},
		{"kube-scheduler.kubeconfig", "kube-scheduler", cp.tokens.scheduler},
		{"kwok.kubeconfig", "kwok", cp.tokens.kwok},
	} {
		if err := cp.WriteKubeconfig(cp.path(k.file), k.user, k.token); err != nil {
			return err
		}
	}
	return nil
}

// WriteKubeconfig writes a kubeconfig (mode 0600) for this API server that
// authenticates with token as user (the name is only the entry's label).
func (cp *ControlPlane) WriteKubeconfig(path, user, token string) error {
	c := clientcmdapi.NewConfig()
	c.Clusters["amf-test"] = &clientcmdapi.Cluster{Server: cp.Host, CertificateAuthorityData: cp.pki.caPEM}
	c.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	c.Contexts["amf-test"] = &clientcmdapi.Context{Cluster: "amf-test", AuthInfo: user, Namespace: metav1.NamespaceDefault}
	c.CurrentContext = "amf-test"
	return clientcmd.WriteToFile(*c, path)
}

func (cp *ControlPlane) etcdArgs() []string {
	client := "http://127.0.0.1:" + itoa(cp.ports.etcd)
	peer := "http://127.0.0.1:" + itoa(cp.ports.etcdPeer)
	return []string{
		"--name=etcd0",
		"--data-dir=" + cp.path("etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=etcd0=" + peer,
		"--initial-cluster-state=new",
		"--unsafe-no-fsync=true", // a test cluster: speed over durability
		"--log-level=warn",
	}
}

func (cp *ControlPlane) apiserverArgs() []string {
	return append([]string{
		"--etcd-servers=http://127.0.0.1:" + itoa(cp.ports.etcd),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + itoa(cp.ports.apiserver),
		"--tls-cert-file=" + cp.pki.servingCert,
		"--tls-private-key-file=" + cp.pki.servingK,
		"--client-ca-file=" + cp.pki.caCert,
		"--token-auth-file=" + cp.path("pki", "tokens.csv"),
		"--requestheader-client-ca-file=" + cp.pki.caCert,
		"--requestheader-allowed-names=" + frontProxyName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + cp.pki.proxyCert,
		"--proxy-client-key-file=" + cp.pki.proxyKey,
		"--authorization-mode=Node,RBAC",
		// Real kubelets (lab/kubenode): reach them by the InternalIP they report
		// (node names do not resolve), authenticated as system:masters.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + cp.pki.kubeletCert,
		"--kubelet-client-key=" + cp.pki.kubeletK,
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + cp.pki.saPub,
		"--service-account-signing-key-file=" + cp.pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// The "kubernetes" Service's endpoint would be 127.0.0.1, which endpoints refuse.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		// On SIGTERM: answer 429 + Retry-After until requests in flight are done,
		// then close connections within 2 s, instead of waiting up to 60 s for
		// the controllers' watches.
		"--shutdown-send-retry-after=true",
	}, cp.opts.APIServerFlags...)
}

func (cp *ControlPlane) kcmArgs() []string {
	kc := cp.path("kube-controller-manager.kubeconfig")
	return append([]string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + itoa(cp.ports.kcm),
		"--leader-elect=false",
		"--controllers=*", // deployment, replicaset, nodelifecycle, serviceaccount(-token), garbagecollector, ...
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + cp.pki.saKey,
		"--root-ca-file=" + cp.pki.caCert,
		"--cluster-signing-cert-file=" + cp.pki.caCert,
		"--cluster-signing-key-file=" + cp.pki.caKey,
		"--kube-api-qps=100",
		"--kube-api-burst=200",
		"--profiling=false",
	}, cp.opts.ControllerManagerFlags...)
}

func (cp *ControlPlane) schedulerArgs() []string {
	kc := cp.path("kube-scheduler.kubeconfig")
	return append([]string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + itoa(cp.ports.scheduler),
		"--leader-elect=false",
		"--profiling=false",
	}, cp.opts.SchedulerFlags...)
}

func (cp *ControlPlane) kwokArgs() []string {
	args := []string{
		"--kubeconfig=" + cp.path("kwok.kubeconfig"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--node-ip=127.0.0.1",
		"--node-port=" + itoa(cp.ports.kwok),
		"--server-address=127.0.0.1:" + itoa(cp.ports.kwok),
		"--node-lease-duration-seconds=40",
		"--cidr=10.244.0.1/16",
	}
	for _, s := range kwokStages {
		args = append(args, "--config="+filepath.Join(cp.BinDir, "kwok-stage", s))
	}
	return append(args, cp.opts.KwokFlags...)
}

// AddNode creates a kwok fake node and waits until it is Ready.
func (cp *ControlPlane) AddNode(ctx context.Context, name string) error {
	if err := cp.createNode(ctx, name); err != nil {
		return err
	}
	if err := cp.waitNodesReady(ctx, name); err != nil {
		return err
	}
	cp.mu.Lock()
	cp.Nodes = append(cp.Nodes, name)
	cp.mu.Unlock()
	return nil
}

func (cp *ControlPlane) createNode(ctx context.Context, name string) error {
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels: map[string]string{
				"type": "kwok", "kubernetes.io/hostname": name,
				"kubernetes.io/os": "linux", "kubernetes.io/arch": runtime.GOARCH,
			},
		},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			NodeInfo: corev1.NodeSystemInfo{
				Architecture: runtime.GOARCH, OperatingSystem: "linux",
				KubeletVersion: "fake",
			},
		},
	}
	_, err := cp.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	return err
}

// waitNodesReady watches nodes until the named ones are Ready and have lost the
// node.kubernetes.io/not-ready taint (so pods can be scheduled at once).
func (cp *ControlPlane) waitNodesReady(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = false
	}
	lw := cache.NewListWatchFromClient(cp.client.CoreV1().RESTClient(), "nodes", "", fields.Everything())
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			return false, nil
		}
		if _, ok := want[n.Name]; !ok {
			return false, nil
		}
		want[n.Name] = ev.Type != watch.Deleted && NodeSchedulable(n)
		for _, ready := range want {
			if !ready {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for nodes %v to be Ready: %w", names, contextCause(ctx, err))
	}
	return nil
}

// WaitNodeSchedulable watches the Node name until NodeSchedulable holds,
// and returns it; an error carries ctx's cause where it has one (a node's
// process that exited, say).
func WaitNodeSchedulable(ctx context.Context, c kubernetes.Interface, name string) (*corev1.Node, error) {
	lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", name))
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Node{}, nil, func(ev watch.Event) (bool, error) {
		nd, ok := ev.Object.(*corev1.Node)
		return ok && ev.Type != watch.Deleted && NodeSchedulable(nd), nil
	})
	if err != nil {
		return nil, contextCause(ctx, err)
	}
	return ev.Object.(*corev1.Node), nil
}

// NodeSchedulable says a Node is Ready and without the not-ready or
// unreachable taint that keeps pods off it.
func NodeSchedulable(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable {
			return false
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitServiceAccount watches until the ServiceAccount exists (the controller
// manager creates "default" in each new namespace).
func (cp *ControlPlane) WaitServiceAccount(ctx context.Context, namespace, name string) error {
	lw := cache.NewListWatchFromClient(cp.client.CoreV1().RESTClient(), "serviceaccounts", namespace,
		fields.OneTermEqualSelector("metadata.name", name))
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.ServiceAccount{}, nil, func(ev watch.Event) (bool, error) {
		return ev.Type == watch.Added || ev.Type == watch.Modified, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for ServiceAccount %s/%s: %w", namespace, name, contextCause(ctx, err))
	}
	return nil
}

func contextCause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && !errors.Is(c, err) {
		return fmt.Errorf("%w (%w)", err, c)
	}
	return err
}

// ClientCertificate signs a client certificate (PEM) for user cn in groups
// (x509 authentication: the kubelet is system:node:<name> in system:nodes,
// kube-proxy system:kube-proxy).
func (cp *ControlPlane) ClientCertificate(cn string, groups ...string) (certPEM, keyPEM []byte, err error) {
	return cp.pki.issueClient(cn, groups...)
}

// CAPEM returns the cluster CA's certificate (PEM): it signs the API server's
// serving certificate and every client certificate.
func (cp *ControlPlane) CAPEM() []byte { return append([]byte(nil), cp.pki.caPEM...) }

// CAFile is the path of the cluster CA's certificate.
func (cp *ControlPlane) CAFile() string { return cp.pki.caCert }

// APIServerPort is the API server's port on 127.0.0.1.
func (cp *ControlPlane) APIServerPort() int { return cp.ports.apiserver }

// WriteCertKubeconfig writes a kubeconfig (mode 0600) for server (default
// Host) that authenticates with a client certificate.
func (cp *ControlPlane) WriteCertKubeconfig(path, server string, certPEM, keyPEM []byte) error {
	if server == "" {
		server = cp.Host
	}
	c := clientcmdapi.NewConfig()
	c.Clusters["amf-test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cp.pki.caPEM}
	c.AuthInfos["client"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	c.Contexts["amf-test"] = &clientcmdapi.Context{Cluster: "amf-test", AuthInfo: "client", Namespace: metav1.NamespaceDefault}
	c.CurrentContext = "amf-test"
	return clientcmd.WriteToFile(*c, path)
}

// AdminConfig returns a rest.Config of a cluster admin (group system:masters).
func (cp *ControlPlane) AdminConfig() *rest.Config { return rest.CopyConfig(cp.admin) }

// Client returns a clientset with AdminConfig.
func (cp *ControlPlane) Client() kubernetes.Interface { return cp.client }

// TokenConfig returns a rest.Config authenticating with a bearer token only (for
// example a ServiceAccount token from ServiceAccountToken).
func (cp *ControlPlane) TokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            cp.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.pki.caPEM},
		QPS:             100,
		Burst:           200,
	}
}

// ImpersonateConfig returns an admin rest.Config impersonating user (and groups):
// requests are authorized as that identity, so RBAC applies to it.
func (cp *ControlPlane) ImpersonateConfig(user string, groups ...string) *rest.Config {
	c := cp.AdminConfig()
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return c
}

// ServiceAccountToken creates the ServiceAccount if missing and returns a token
// for it from the TokenRequest API. spec may set Audiences (default: the API
// server's, ServiceAccountIssuer), ExpirationSeconds and BoundObjectRef (a Pod
// whose spec.serviceAccountName is this ServiceAccount binds the token to it).
func (cp *ControlPlane) ServiceAccountToken(ctx context.Context, namespace, name string, spec authenticationv1.TokenRequestSpec) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := cp.client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	tr, err := cp.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// ServiceAccountConfig returns a rest.Config acting as the ServiceAccount (created
// if missing), with a one-hour token for the API server.
func (cp *ControlPlane) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	exp := int64(3600)
	tok, err := cp.ServiceAccountToken(ctx, namespace, name, authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp})
	if err != nil {
		return nil, err
	}
	return cp.TokenConfig(tok), nil
}

// Kubectl runs the built kubectl against the cluster (admin kubeconfig, HOME in
// Dir) with stdin (may be nil), and returns its stdout; stderr is in the error.
func (cp *ControlPlane) Kubectl(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, cp.KubectlPath, append([]string{"--kubeconfig=" + cp.Kubeconfig}, args...)...)
	cmd.Env = append(childEnv(filepath.Join(cp.Dir, "home")), "KUBECONFIG="+cp.Kubeconfig)
	cmd.Stdin = stdin
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// StopAPIServer stops the API server only (SIGTERM, then SIGKILL after 15 s);
// StartAPIServer starts it again on the same port and waits until it is ready.
func (cp *ControlPlane) StopAPIServer() { cp.stopSlot(&cp.apiserver, 15*time.Second) }

// StartAPIServer restarts a stopped API server (see StopAPIServer).
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	return cp.startAgain(ctx, &cp.apiserver, "kube-apiserver", cp.apiserverArgs())
}

// RestartAPIServer stops and starts the API server.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) error {
	cp.StopAPIServer()
	return cp.StartAPIServer(ctx)
}

// StopControllerManager stops the controller manager only (SIGTERM, then
// SIGKILL after 15 s): the cluster as a slow or restarting one leaves it,
// no ReplicaSet, Deployment or EndpointSlice controller acting.
func (cp *ControlPlane) StopControllerManager() { cp.stopSlot(&cp.kcm, 15*time.Second) }

// StartControllerManager starts a stopped controller manager again (see
// StopControllerManager).
func (cp *ControlPlane) StartControllerManager(ctx context.Context) error {
	return cp.startAgain(ctx, &cp.kcm, "kube-controller-manager", cp.kcmArgs())
}

// KillEtcd kills etcd (SIGKILL to its process group), as a crash would;
// the API server runs on, failing what needs storage, until StartEtcd.
func (cp *ControlPlane) KillEtcd() { cp.stopSlot(&cp.etcd, 0) }

// stopSlot stops the component in slot with the grace given (0: SIGKILL).
func (cp *ControlPlane) stopSlot(slot **process, grace time.Duration) {
	cp.mu.Lock()
	p := *slot
	cp.mu.Unlock()
	p.stop(grace)
}

// StartEtcd starts a killed etcd again on its ports and data directory, and
// waits until the API server is ready on it again.
func (cp *ControlPlane) StartEtcd(ctx context.Context) error {
	return cp.startAgain(ctx, &cp.etcd, "etcd", cp.etcdArgs())
}

// RestartEtcd kills etcd and starts it again (KillEtcd, StartEtcd).
func (cp *ControlPlane) RestartEtcd(ctx context.Context) error {
	cp.KillEtcd()
	return cp.StartEtcd(ctx)
}

// startAgain starts the component in slot (etcd, the API server or the
// controller manager) again, once it has stopped, and waits until the API
// server is ready, or etcd or the API server exits.
func (cp *ControlPlane) startAgain(ctx context.Context, slot **process, name string, args []string) error {
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return errors.New("controlplane: stopped")
	}
	if (*slot).running() {
		cp.mu.Unlock()
		return fmt.Errorf("controlplane: %s is running", name)
	}
	p := cp.newProcess(name, args)
	*slot = p
	etcd, apiserver := cp.etcd, cp.apiserver
	cp.mu.Unlock()
	if err := p.start(); err != nil {
		return err
	}
	wctx, cancel := untilExit(ctx, etcd, apiserver)
	defer cancel()
	return cp.waitAPIServer(wctx)
}

// Stop stops every component: kwok, scheduler and controller manager, then the
// API server, then etcd (the API server must not outlive its storage), each by
// SIGTERM to its process group and SIGKILL after a grace period. It is called by
// tb.Cleanup (Start) or the caller (Launch); calling it twice is fine.
func (cp *ControlPlane) Stop() {
	cp.mu.Lock()
	cp.stopped = true
	cp.mu.Unlock()
	cp.stopProcesses()
}

func (cp *ControlPlane) stopProcesses() {
	cp.mu.Lock()
	clients := []*process{cp.kw, cp.scheduler, cp.kcm}
	apiserver, etcd := cp.apiserver, cp.etcd
	cp.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range clients {
		if p != nil {
			wg.Go(func() { p.stop(10 * time.Second) })
		}
	}
	wg.Wait()
	if apiserver != nil {
		apiserver.stop(15 * time.Second)
	}
	if etcd != nil {
		etcd.stop(10 * time.Second)
	}
}

// DumpLogs writes the end of each component's log to the test log (Launch: its logf).
func (cp *ControlPlane) DumpLogs() {
	cp.mu.Lock()
	procs := []*process{cp.etcd, cp.apiserver, cp.kcm, cp.scheduler, cp.kw}
	cp.mu.Unlock()
	for _, p := range procs {
		if p == nil {
			continue
		}
		cp.logf("---- %s (%s), last 16 KiB ----\n%s", p.name, p.logPath, p.logTail(16<<10))
	}
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
