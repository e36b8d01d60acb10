package statehub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/amf-edge/amf/podsignal"
)

// Client is a sidecar's side of the hub: its pod's path on its node's agent.
type Client struct {
	// URL is the hub, e.g. http://10.0.0.5:1886.
	URL string
	Pod podsignal.PodID
	// TokenFile is the pod's projected token, read at every request (the
	// kubelet rotates it); Token a static one when TokenFile is empty.
	TokenFile string
	Token     string
	// HTTP is the client; default one without a timeout (Fetch long-polls:
	// bound it with ctx).
	HTTP *http.Client
}

// CheckURL checks a hub URL: http or https, a host, no path.
func CheckURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("state hub URL %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" {
		return fmt.Errorf("state hub URL %q: want http://<node address>:<port>, as in http://10.0.0.5:1886", s)
	}
	return nil
}

func (c *Client) request(ctx context.Context, method string, kind Kind, body []byte, query url.Values) (*http.Response, error) {
	token := c.Token
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("statehub: token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	u := strings.TrimSuffix(c.URL, "/") + PathPrefix + c.Pod.Namespace + "/" + c.Pod.Pod
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("statehub: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if kind != "" {
		req.Header.Set(KindHeader, string(kind))
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	return hc.Do(req)
}

// HandIn hands the pod's broker state in and returns the ID the hub gave it.
func (c *Client) HandIn(ctx context.Context, kind Kind, data []byte) (string, error) {
	if len(data) > MaxStateBytes {
		return "", fmt.Errorf("statehub: state of %d bytes, more than %d", len(data), MaxStateBytes)
	}
	resp, err := c.request(ctx, http.MethodPut, kind, data, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusNoContent {
		return "", refusal(resp)
	}
	return resp.Header.Get(IDHeader), nil
}

// Fetch waits (the hub's long poll, ctx at most) for the state handed on to
// the pod, other than the one named have (the pod holds it already; "":
// none). ok is false when none came within the poll: ask again.
func (c *Client) Fetch(ctx context.Context, have string) (State, bool, error) {
	var q url.Values
	if have != "" {
		q = url.Values{"have": {have}}
	}
	resp, err := c.request(ctx, http.MethodGet, "", nil, q)
	if err != nil {
		return State{}, false, err
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusNoContent:
		return State{}, false, nil
	case http.StatusOK:
	default:
		return State{}, false, refusal(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxStateBytes+1))
	if err != nil {
		return State{}, false, fmt.Errorf("statehub: state not read whole: %w", err)
	}
	if len(data) > MaxStateBytes {
		return State{}, false, fmt.Errorf("statehub: state over %d bytes", MaxStateBytes)
	}
	ns, pod, _ := strings.Cut(resp.Header.Get(FromHeader), "/")
	return State{ID: resp.Header.Get(IDHeader), Kind: Kind(resp.Header.Get(KindHeader)), From: podsignal.PodID{Namespace: ns, Pod: pod}, Data: data}, true, nil
}

// ErrRefused is wrapped when the hub answers with an error.
var ErrRefused = errors.New("statehub: refused")

func refusal(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return fmt.Errorf("%w: %s: %s", ErrRefused, resp.Status, strings.TrimSpace(string(b)))
}
