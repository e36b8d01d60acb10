package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probe runs a container's probes for one run: the startup probe until it
// succeeds, then the readiness and liveness probes side by side. Regular init
// containers have no probes.
func (c *ctr) probe(ctx context.Context, in *instance) {
	if c.kind == kindInit {
		return
	}
	grace := func(pr *corev1.Probe) time.Duration {
		if pr.TerminationGracePeriodSeconds != nil {
			return time.Duration(*pr.TerminationGracePeriodSeconds) * time.Second
		}
		if g := c.p.apiPod().Spec.TerminationGracePeriodSeconds; g != nil {
			return time.Duration(*g) * time.Second
		}
		return 30 * time.Second
	}
	if pr := c.spec.StartupProbe; pr != nil {
		ok := c.probeLoop(ctx, in, pr, "startup", func(success bool) bool { return true })
		if ctx.Err() != nil {
			return
		}
		if !ok {
			c.p.log.Info("startup probe failed, killing container", "container", c.name)
			c.kill(in, max(grace(pr), minGrace), "startup probe failed")
			return
		}
		c.p.mu.Lock()
		if c.st.run == in {
			c.st.started = true
			c.st.ready = c.spec.ReadinessProbe == nil
		}
		ready := c.st.ready
		c.p.notifyLocked()
		c.p.mu.Unlock()
		if ready {
			c.emitReady(in, true)
		}
	}
	var wg sync.WaitGroup
	if pr := c.spec.ReadinessProbe; pr != nil {
		wg.Go(func() {
			c.probeLoop(ctx, in, pr, "readiness", func(success bool) bool {
				c.setReady(in, success)
				return false
			})
		})
	}
	if pr := c.spec.LivenessProbe; pr != nil {
		wg.Go(func() {
			ok := c.probeLoop(ctx, in, pr, "liveness", func(success bool) bool { return !success })
			if !ok && ctx.Err() == nil {
				c.p.log.Info("liveness probe failed, killing container", "container", c.name)
				c.kill(in, max(grace(pr), minGrace), "liveness probe failed")
			}
		})
	}
	wg.Wait()
}

// setReady records a readiness result of run in.
func (c *ctr) setReady(in *instance, ready bool) {
	c.p.mu.Lock()
	changed := c.st.run == in && c.st.started && c.st.ready != ready
	if changed {
		c.st.ready = ready
		c.p.notifyLocked()
	}
	c.p.mu.Unlock()
	if changed {
		c.emitReady(in, ready)
	}
}

func (c *ctr) emitReady(in *instance, ready bool) {
	ev := c.event(EventNotReady)
	if ready {
		ev.Type = EventReady
	}
	ev.ContainerID, ev.PID, ev.RestartCount = in.id, in.pid, c.restartCount()
	c.p.n.emit(ev)
}

// probeLoop probes every period after the initial delay, turning results
// into a verdict with the success and failure thresholds. Each verdict that
// differs from the previous one (the first counts) goes to onVerdict; the loop
// ends when onVerdict returns true, returning the verdict, or when ctx ends.
func (c *ctr) probeLoop(ctx context.Context, in *instance, pr *corev1.Probe, kind string, onVerdict func(bool) bool) bool {
	clk := c.p.n.clock
	period := secondsOr(pr.PeriodSeconds, 10)
	timeout := secondsOr(pr.TimeoutSeconds, 1)
	successes, failures := int(pr.SuccessThreshold), int(pr.FailureThreshold)
	if successes <= 0 {
		successes = 1
	}
	if failures <= 0 {
		failures = 3
	}
	delay := time.Duration(pr.InitialDelaySeconds)*time.Second - clk.Since(in.startedAt)
	if !sleep(ctx, clk, delay, nil) {
		return false
	}
	var verdict *bool
	okRun, failRun := 0, 0
	for {
		err := c.runProbe(ctx, in, pr, timeout)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			okRun, failRun = okRun+1, 0
		} else {
			okRun, failRun = 0, failRun+1
			c.p.log.Debug("probe failed", "container", c.name, "probe", kind, "err", err, "failures", failRun)
		}
		var v *bool
		switch {
		case okRun >= successes:
			v = ptrTo(true)
		case failRun >= failures:
			v = ptrTo(false)
		}
		if v != nil && (verdict == nil || *verdict != *v) {
			verdict = v
			if onVerdict(*v) {
				return *v
			}
		}
		if !sleep(ctx, clk, period, nil) {
			return false
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

func secondsOr(s int32, def int) time.Duration {
	if s <= 0 {
		return time.Duration(def) * time.Second
	}
	return time.Duration(s) * time.Second
}

// runProbe runs one probe; nil is success.
func (c *ctr) runProbe(ctx context.Context, in *instance, pr *corev1.Probe, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	host := c.p.n.cfg.HostIP
	switch {
	case pr.Exec != nil:
		return c.execProbe(ctx, in, pr.Exec.Command)
	case pr.TCPSocket != nil:
		if pr.TCPSocket.Host != "" {
			host = pr.TCPSocket.Host
		}
		port, err := c.port(pr.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case pr.HTTPGet != nil:
		g := pr.HTTPGet
		if g.Host != "" {
			host = g.Host
		}
		port, err := c.port(g.Port)
		if err != nil {
			return err
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		u := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: g.Path}
		if p, q, ok := strings.Cut(g.Path, "?"); ok {
			u.Path, u.RawQuery = p, q
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return err
		}
		req.Header.Set("User-Agent", "kube-probe/lab")
		for _, h := range g.HTTPHeaders {
			if strings.EqualFold(h.Name, "Host") {
				req.Host = h.Value
				continue
			}
			req.Header.Add(h.Name, h.Value)
		}
		hc := &http.Client{
			// The kubelet does not verify probe certificates, and takes a
			// redirect as success.
			Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	case pr.GRPC != nil:
		return errors.New("gRPC probes are not supported by the lab node")
	}
	return errors.New("probe without a handler")
}

// port resolves a probe's port, by number or by the name of a container port.
func (c *ctr) port(p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("no container port named %q", p.StrVal)
}

// execProbe runs a command in the container (its cgroups, environment,
// directory and user); exit 0 is success. $(VAR) is expanded with the
// container's variables, and paths rewritten, as in args.
func (c *ctr) execProbe(ctx context.Context, in *instance, command []string) error {
	if len(command) == 0 {
		return errors.New("exec probe without a command")
	}
	argv := make([]string, len(command))
	for i, a := range command {
		argv[i] = rewritePaths(expand(a, lookupIn(in.vars)), in.rewrites)
	}
	exe, err := lookPath(argv[0], in.env)
	if err != nil {
		return err
	}
	cmd := &exec.Cmd{Path: exe, Args: argv, Env: in.env, Dir: in.dir,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: in.cred}}
	if err := c.p.n.cg.spawn(cmd, in.cgroup); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("command timed out: %w", ctx.Err())
	}
}
