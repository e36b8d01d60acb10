// Package brokerstate puts state into a real MQTT broker with real clients,
// and checks what of it a broker holds afterwards (the standby after a
// handover, the same broker after a restart): retained messages, persistent
// sessions with their subscriptions, and QoS 1 messages queued for them
// while they were away. Test and benchmark infrastructure; product code
// never imports it.
//
// The clients are peers nobody here wrote: paho.mqtt.golang for MQTT 3.1.1
// (clean session 0), and Debian's mosquitto_sub for MQTT 5 (-V 5 -c -x:
// clean start 0 and a session expiry). Session Present is read from each
// session's CONNACK (MQTT 5's with a CONNECT of mochi's packets, as
// mosquitto_sub does not show it). Completion is awaited, never slept for: every check ends
// with a marker message published after the checker is connected, which the
// broker delivers after anything it had for that client, so once the marker
// is in, whatever was held has arrived.
package brokerstate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Plan is the state Seed creates and Check looks for.
type Plan struct {
	// Retained topics Prefix/r/<i>, each with payload "r<i>", retained, QoS 1.
	Retained int
	// Sessions of MQTT 3.1.1 clients Prefix-v3-<i> (paho, clean session 0),
	// each subscribed at QoS 1 to Prefix/q/v3-<i>.
	Sessions int
	// Sessions of MQTT 5 clients Prefix-v5-<i> (mosquitto_sub -V 5 -c -x
	// 3600), each subscribed at QoS 1 to Prefix/q/v5-<i>. Needs MosquittoSub.
	// mosquitto_sub shows no session-present flag, so Check reads it with a
	// CONNECT of its own first, then lets mosquitto_sub take the queue.
	V5Sessions int
	// Queued QoS 1 messages published to each session's topic while it is
	// offline, payloads "q<j>".
	Queued int
	// Prefix of topics and client IDs; default "amf-state".
	Prefix string
	// MosquittoSub is Debian's MQTT 5 client; default from PATH.
	MosquittoSub string
}

func (p Plan) prefix() string {
	if p.Prefix == "" {
		return "amf-state"
	}
	return p.Prefix
}

// Topic is a topic of the plan's own beside those Seed and Check use:
// Prefix/name.
func (p Plan) Topic(name string) string { return p.prefix() + "/" + name }

// WithClock is the plan as a broker holds it once a Clock publishes to
// Topic("clock"): one retained message more. A snapshot that counts it
// carries a clock value.
func (p Plan) WithClock() Plan {
	p.Retained++
	return p
}

func (p Plan) sessionIDs() (v3, v5 []string) {
	for i := range p.Sessions {
		v3 = append(v3, fmt.Sprintf("%s-v3-%d", p.prefix(), i))
	}
	for i := range p.V5Sessions {
		v5 = append(v5, fmt.Sprintf("%s-v5-%d", p.prefix(), i))
	}
	return v3, v5
}

func (p Plan) queueTopic(id string) string {
	return p.prefix() + "/q/" + strings.TrimPrefix(id, p.prefix()+"-")
}

// SessionIDs are the client IDs of the plan's sessions, 3.1.1 ones first.
func (p Plan) SessionIDs() []string {
	v3, v5 := p.sessionIDs()
	return append(v3, v5...)
}

// Result is what Check found, against the plan.
type Result struct {
	RetainedFound, RetainedLost int
	// SessionsLost are the clients whose session was gone: session present
	// 0, (MQTT 3.1.1) its subscription gone (the marker on its topic never
	// came), or (MQTT 5) none of its queued messages delivered.
	SessionsLost []string
	QueuedFound  int
	QueuedLost   int
	Duplicates   int // queued messages received more than once
}

// Lossless says whether everything of the plan was found.
func (r Result) Lossless() bool {
	return r.RetainedLost == 0 && len(r.SessionsLost) == 0 && r.QueuedLost == 0
}

func (r Result) String() string {
	return fmt.Sprintf("retained %d found, %d lost; sessions lost %v; queued %d found, %d lost, %d duplicates",
		r.RetainedFound, r.RetainedLost, r.SessionsLost, r.QueuedFound, r.QueuedLost, r.Duplicates)
}

// Seed creates the plan's state on the broker at addr (host:port): the
// sessions subscribe and go offline, then the retained and queued messages
// are published, each acknowledged.
func Seed(ctx context.Context, addr string, p Plan) error {
	v3, v5 := p.sessionIDs()
	for _, id := range v3 {
		c, _, err := connect(ctx, addr, id, false, nil)
		if err != nil {
			return err
		}
		err = wait(ctx, c.Subscribe(p.queueTopic(id), 1, nil), "subscribe "+id)
		c.Disconnect(0)
		if err != nil {
			return err
		}
	}
	for _, id := range v5 {
		// -E: exit once subscribed, leaving the session (-c, -x) behind.
		if out, err := p.sub(ctx, addr, id, "-E"); err != nil {
			return fmt.Errorf("mosquitto_sub %s: %w: %s", id, err, out)
		}
	}
	pub, _, err := connect(ctx, addr, p.prefix()+"-seed", true, nil)
	if err != nil {
		return err
	}
	defer pub.Disconnect(0)
	for i := range p.Retained {
		if err := wait(ctx, pub.Publish(fmt.Sprintf("%s/r/%d", p.prefix(), i), 1, true, fmt.Sprintf("r%d", i)), "publish retained"); err != nil {
			return err
		}
	}
	for _, id := range append(v3, v5...) {
		for j := range p.Queued {
			if err := wait(ctx, pub.Publish(p.queueTopic(id), 1, false, fmt.Sprintf("q%d", j)), "publish queued"); err != nil {
				return err
			}
		}
	}
	return nil
}

// Check connects the plan's clients to the broker at addr and counts what
// it holds of the plan. Checking consumes the queued messages (they are
// acknowledged), as a client's return would.
func Check(ctx context.Context, addr string, p Plan) (Result, error) {
	var r Result
	found, err := p.retained(ctx, addr)
	if err != nil {
		return r, err
	}
	r.RetainedFound, r.RetainedLost = found, p.Retained-found
	v3, v5 := p.sessionIDs()
	for _, id := range v3 {
		got, present, err := p.drainV3(ctx, addr, id)
		if err != nil {
			return r, err
		}
		if !present {
			r.SessionsLost = append(r.SessionsLost, id)
		}
		p.count(&r, got)
	}
	for _, id := range v5 {
		present, err := sessionPresent5(ctx, addr, id)
		if err != nil {
			return r, err
		}
		got, err := p.drainV5(ctx, addr, id)
		if err != nil {
			return r, err
		}
		if !present || len(got) == 0 && p.Queued > 0 {
			r.SessionsLost = append(r.SessionsLost, id)
		}
		p.count(&r, got)
	}
	return r, nil
}

// Forget ends the plan's sessions on the broker at addr: each client
// connects with clean session 1, which has Mosquitto discard the session
// it held (an MQTT 5 one too), and leaves. A Check on a broker that held
// none leaves them behind, empty; after Forget a later Check there reads
// Session Present 0 again.
func Forget(ctx context.Context, addr string, p Plan) error {
	for _, id := range p.SessionIDs() {
		c, _, err := connect(ctx, addr, id, true, nil)
		if err != nil {
			return err
		}
		c.Disconnect(0)
	}
	return nil
}

// count adds one session's received payloads to r.
func (p Plan) count(r *Result, got []string) {
	seen := map[string]int{}
	for _, g := range got {
		seen[g]++
	}
	for j := range p.Queued {
		switch n := seen[fmt.Sprintf("q%d", j)]; {
		case n == 0:
			r.QueuedLost++
		default:
			r.QueuedFound++
			r.Duplicates += n - 1
		}
	}
}

// retained subscribes to the retained topics with a fresh clean client and
// counts those with the right payload and the retain flag.
func (p Plan) retained(ctx context.Context, addr string) (int, error) {
	marker := p.prefix() + "/r-marker"
	var (
		mu     sync.Mutex
		found  = map[string]bool{}
		doneCh = make(chan struct{})
		once   sync.Once
	)
	c, _, err := connect(ctx, addr, p.prefix()+"-check-retained", true, nil)
	if err != nil {
		return 0, err
	}
	defer c.Disconnect(0)
	on := func(_ mqtt.Client, m mqtt.Message) {
		if m.Topic() == marker {
			once.Do(func() { close(doneCh) })
			return
		}
		var i int
		if _, err := fmt.Sscanf(m.Topic(), p.prefix()+"/r/%d", &i); err == nil && m.Retained() && string(m.Payload()) == fmt.Sprintf("r%d", i) {
			mu.Lock()
			found[m.Topic()] = true
			mu.Unlock()
		}
	}
	if err := wait(ctx, c.SubscribeMultiple(map[string]byte{p.prefix() + "/r/#": 1, marker: 1}, on), "subscribe retained"); err != nil {
		return 0, err
	}
	if err := wait(ctx, c.Publish(marker, 1, false, "m"), "publish marker"); err != nil {
		return 0, err
	}
	select {
	case <-doneCh:
	case <-ctx.Done():
		return 0, fmt.Errorf("retained check: the marker never came back: %w", ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	return len(found), nil
}

// sessionMarkerWait bounds the wait for a 3.1.1 session's marker: a broker
// that holds the session's subscription delivers it within milliseconds,
// after what it queued.
const sessionMarkerWait = 10 * time.Second

// drainV3 reconnects a 3.1.1 session without subscribing and collects what
// the broker delivers until the marker, published to its topic afterwards,
// arrives; a session without its subscription never sees the marker: after
// sessionMarkerWait it is reported not present (lost for its client, which
// expects its subscription there).
func (p Plan) drainV3(ctx context.Context, addr, id string) (got []string, present bool, err error) {
	var (
		mu     sync.Mutex
		doneCh = make(chan struct{})
		once   sync.Once
	)
	c, present, err := connect(ctx, addr, id, false, func(_ mqtt.Client, m mqtt.Message) {
		if string(m.Payload()) == "marker" {
			once.Do(func() { close(doneCh) })
			return
		}
		mu.Lock()
		got = append(got, string(m.Payload()))
		mu.Unlock()
	})
	if err != nil {
		return nil, false, err
	}
	defer c.Disconnect(0)
	if !present {
		return nil, false, nil
	}
	if err := p.publishMarker(ctx, addr, p.queueTopic(id)); err != nil {
		return nil, true, err
	}
	wait := time.NewTimer(sessionMarkerWait)
	defer wait.Stop()
	select {
	case <-doneCh:
	case <-wait.C:
		return nil, false, nil
	case <-ctx.Done():
		return nil, true, fmt.Errorf("session %s: present, but the marker on its topic never came (%w)", id, ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(got), true, nil
}

// drainV5 runs mosquitto_sub -V 5 as the session's client until the marker,
// which it publishes once the client's SUBSCRIBE is acknowledged.
func (p Plan) drainV5(ctx context.Context, addr, id string) (got []string, err error) {
	host, port, _ := strings.Cut(addr, ":")
	bin := p.MosquittoSub
	if bin == "" {
		bin = "mosquitto_sub"
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// stdbuf: mosquitto_sub's stdout to a pipe is block-buffered, and the
	// SUBACK line must arrive while it runs.
	cmd := exec.CommandContext(cctx, "stdbuf", "-oL", bin, "-V", "5", "-h", host, "-p", port, "-c", "-x", "3600", "-i", id, "-q", "1", "-t", p.queueTopic(id), "-d")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("mosquitto_sub: %w", err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-cctx.Done():
				return
			}
		}
	}()
	marked := false
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return got, fmt.Errorf("mosquitto_sub %s ended before the marker", id)
			}
			switch {
			case strings.Contains(l, "received SUBACK") && !marked:
				marked = true
				if err := p.publishMarker(ctx, addr, p.queueTopic(id)); err != nil {
					return got, err
				}
			case l == "marker":
				return got, nil
			case strings.HasPrefix(l, "q") && !strings.Contains(l, " "):
				got = append(got, l)
			}
		case <-ctx.Done():
			return got, fmt.Errorf("session %s: the marker never came: %w", id, ctx.Err())
		}
	}
}

func (p Plan) publishMarker(ctx context.Context, addr, topic string) error {
	c, _, err := connect(ctx, addr, p.prefix()+"-marker", true, nil)
	if err != nil {
		return err
	}
	defer c.Disconnect(0)
	return wait(ctx, c.Publish(topic, 1, false, "marker"), "publish marker")
}

// sub runs mosquitto_sub -V 5 for session id with extra flags, to its end.
func (p Plan) sub(ctx context.Context, addr, id string, extra ...string) ([]byte, error) {
	host, port, _ := strings.Cut(addr, ":")
	bin := p.MosquittoSub
	if bin == "" {
		bin = "mosquitto_sub"
	}
	args := append([]string{"-V", "5", "-h", host, "-p", port, "-c", "-x", "3600", "-i", id, "-q", "1", "-t", p.queueTopic(id)}, extra...)
	return exec.CommandContext(ctx, bin, args...).CombinedOutput()
}

// connect opens a paho 3.1.1 connection and reports the CONNACK's
// session-present flag. Handlers run in order, one at a time, so a marker's
// handler runs after those of every message before it.
func connect(ctx context.Context, addr, id string, clean bool, onMessage mqtt.MessageHandler) (mqtt.Client, bool, error) {
	o := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(clean).
		SetAutoReconnect(false).SetConnectRetry(false).SetProtocolVersion(4).SetOrderMatters(true).
		SetConnectTimeout(5 * time.Second).SetKeepAlive(30 * time.Second)
	if onMessage != nil {
		o.SetDefaultPublishHandler(onMessage)
	}
	c := mqtt.NewClient(o)
	t := c.Connect()
	if err := wait(ctx, t, "connect "+id); err != nil {
		return nil, false, err
	}
	return c, t.(*mqtt.ConnectToken).SessionPresent(), nil
}

func wait(ctx context.Context, t mqtt.Token, what string) error {
	select {
	case <-t.Done():
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
	if err := t.Error(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if s, ok := t.(*mqtt.SubscribeToken); ok {
		for topic, q := range s.Result() {
			if q == 0x80 {
				return fmt.Errorf("%s: subscription to %s refused", what, topic)
			}
		}
	}
	return nil
}

// ErrNoClient is returned when Debian's MQTT 5 client is missing.
var ErrNoClient = errors.New("brokerstate: mosquitto_sub not found (apt-get install mosquitto-clients; make deps)")

// MosquittoSub finds Debian's mosquitto_sub.
func MosquittoSub() (string, error) {
	p, err := exec.LookPath("mosquitto_sub")
	if err != nil {
		return "", ErrNoClient
	}
	return p, nil
}
