package vmnode

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// probePort is the guest port of guestprobe, forwarded from the host's
// loopback for every node.
const probePort = 7070

// ReadFile reads a file of the guest.
func (n *Node) ReadFile(ctx context.Context, path string) ([]byte, error) {
	return n.probe(ctx, "/file?"+url.Values{"path": {path}}.Encode())
}

// Glob lists the guest's paths that match pattern (filepath.Glob's syntax).
func (n *Node) Glob(ctx context.Context, pattern string) ([]string, error) {
	b, err := n.probe(ctx, "/glob?"+url.Values{"pattern": {pattern}}.Encode())
	if err != nil || len(b) == 0 {
		return nil, err
	}
	return strings.Split(string(b), "\n"), nil
}

// Run runs a program in the guest as root and returns its output: one of the
// run's disk (under /amf) or of the guest's diagnostics (iptables-save,
// journalctl, systemctl, ip, ps).
func (n *Node) Run(ctx context.Context, prog string, args ...string) ([]byte, error) {
	b, exit, err := n.probeExit(ctx, "/run?"+url.Values{"prog": {prog}, "arg": args}.Encode())
	if err == nil && exit != "" {
		err = fmt.Errorf("%s in the guest: %s\n%s", prog, exit, tail(b, 8<<10))
	}
	return b, err
}

func (n *Node) probe(ctx context.Context, path string) ([]byte, error) {
	b, _, err := n.probeExit(ctx, path)
	return b, err
}

func (n *Node) probeExit(ctx context.Context, path string) ([]byte, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.Forwarded[probePort]+path, nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("the guest's probe: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", fmt.Errorf("the guest's probe: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("the guest's probe: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return b, resp.Header.Get("X-Exit"), nil
}

// GetIn GETs url from inside the network namespace of the guest's process
// pid (a pod's: its loopback-only endpoints).
func (n *Node) GetIn(ctx context.Context, pid int, url string) ([]byte, error) {
	return n.probe(ctx, "/get?"+urlValues("pid", fmt.Sprint(pid), "url", url))
}

func urlValues(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v.Encode()
}

// Kill sends SIGKILL to the guest's process pid and returns the guest's
// clock just before it did: the guest's clock, like the agent's in a pod
// of it, which runs at its own pace.
func (n *Node) Kill(ctx context.Context, pid int) (time.Time, error) {
	b, err := n.probe(ctx, "/kill?"+urlValues("pid", fmt.Sprint(pid)))
	if err != nil {
		return time.Time{}, err
	}
	return time.Parse(time.RFC3339Nano, string(b))
}
