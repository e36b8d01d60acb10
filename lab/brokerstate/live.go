package brokerstate

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Live is traffic across an event, as a user's devices make it: a QoS 1
// publisher and a QoS 1 subscriber of one topic, each an MQTT 3.1.1
// persistent session (paho, clean session 0, reconnecting by itself, its
// in-flight messages sent again after a reconnect). What they see says what
// an event costs the clients that were connected through it: messages the
// broker acknowledged that never reached the subscriber, messages received
// twice, and the longest time without an acknowledgement or a delivery.
type Live struct {
	pub, sub mqtt.Client
	topic    string
	stop     chan struct{}
	done     chan struct{}

	mu       sync.Mutex
	acked    map[int]bool // by sequence number
	failed   int          // publishes the client gave up on
	whyFail  string       // the first of them: what the client said
	received map[int]int  // deliveries by sequence number
	lastAck  time.Time
	lastRecv time.Time
	ackGap   time.Duration
	recvGap  time.Duration
	marker   chan struct{} // closed when the end marker arrives
}

// LiveResult is what Live saw.
type LiveResult struct {
	Published, Acked, Received int
	// Lost are messages the broker acknowledged (PUBACK) that the
	// subscriber never received; Refused, publishes the client gave up on.
	Lost, Refused, Duplicates int
	// WhyRefused is what the client said of the first refused publish.
	WhyRefused string
	// AckGap and ReceiveGap are the longest times between two
	// acknowledgements and between two deliveries: the outage the
	// publisher and the subscriber saw.
	AckGap, ReceiveGap time.Duration
	// MarkerMissed: the subscriber never got the end marker (its session,
	// and with it its subscription, was lost).
	MarkerMissed bool
}

// liveConnect bounds the clients' first connects.
const liveConnect = 30 * time.Second

// markerWait bounds the wait for the end marker after the last
// acknowledgement: a delivery takes milliseconds.
const markerWait = 15 * time.Second

func (r LiveResult) String() string {
	s := fmt.Sprintf("%d published, %d acknowledged, %d received; %d lost, %d refused, %d duplicates; longest without an acknowledgement %v, without a delivery %v",
		r.Published, r.Acked, r.Received, r.Lost, r.Refused, r.Duplicates, r.AckGap.Round(time.Millisecond), r.ReceiveGap.Round(time.Millisecond))
	if r.WhyRefused != "" {
		s += " (the first refused: " + r.WhyRefused + ")"
	}
	return s
}

// StartLive connects the subscriber, then the publisher, to addr (host:port)
// through dial (nil: the host's network), and publishes every interval
// until Stop.
func StartLive(ctx context.Context, addr, prefix string, every time.Duration, dial func(ctx context.Context, addr string) (net.Conn, error)) (*Live, error) {
	l := &Live{topic: prefix + "/live", stop: make(chan struct{}), done: make(chan struct{}), acked: map[int]bool{}, received: map[int]int{},
		marker: make(chan struct{})}
	opts := func(id string) *mqtt.ClientOptions {
		o := mqtt.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(false).
			SetAutoReconnect(true).SetMaxReconnectInterval(500 * time.Millisecond).SetConnectRetry(true).
			SetConnectRetryInterval(200 * time.Millisecond).SetKeepAlive(5 * time.Second).SetConnectTimeout(2 * time.Second).
			SetOrderMatters(false)
		if dial != nil {
			o.SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) { return dial(ctx, u.Host) })
		}
		return o
	}
	so := opts(prefix + "-live-sub").SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if string(m.Payload()) == "end" {
			select {
			case <-l.marker:
			default:
				close(l.marker)
			}
			return
		}
		n, err := strconv.Atoi(string(m.Payload()))
		if err != nil {
			return
		}
		l.received[n]++
		now := time.Now()
		if !l.lastRecv.IsZero() {
			l.recvGap = max(l.recvGap, now.Sub(l.lastRecv))
		}
		l.lastRecv = now
	})
	// The clients retry by themselves; a connect that never succeeds (no
	// route, no endpoint) ends here with the reason, not at the caller's
	// deadline.
	cctx, cancel := context.WithTimeout(ctx, liveConnect)
	defer cancel()
	l.sub = mqtt.NewClient(so)
	if err := wait(cctx, l.sub.Connect(), "live subscriber connect to "+addr); err != nil {
		l.sub.Disconnect(0) // ends its retries
		return nil, err
	}
	if err := wait(cctx, l.sub.Subscribe(l.topic, 1, nil), "live subscribe"); err != nil {
		l.sub.Disconnect(0)
		return nil, err
	}
	l.pub = mqtt.NewClient(opts(prefix + "-live-pub"))
	if err := wait(cctx, l.pub.Connect(), "live publisher connect to "+addr); err != nil {
		l.pub.Disconnect(0)
		l.sub.Disconnect(0)
		return nil, err
	}
	go l.publish(every)
	return l, nil
}

func (l *Live) publish(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	var pending sync.WaitGroup
	defer pending.Wait()
	for n := 0; ; n++ {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		tok := l.pub.Publish(l.topic, 1, false, strconv.Itoa(n))
		l.mu.Lock()
		l.acked[n] = false
		l.mu.Unlock()
		pending.Go(func() {
			done := tok.WaitTimeout(time.Minute)
			l.mu.Lock()
			defer l.mu.Unlock()
			if !done || tok.Error() != nil {
				if l.failed++; l.failed == 1 {
					l.whyFail = fmt.Sprintf("message %d: no answer within a minute", n)
					if done {
						l.whyFail = fmt.Sprintf("message %d: %v", n, tok.Error())
					}
				}
				return
			}
			l.acked[n] = true
			now := time.Now()
			if !l.lastAck.IsZero() {
				l.ackGap = max(l.ackGap, now.Sub(l.lastAck))
			}
			l.lastAck = now
		})
	}
}

// Stop ends the publishing, waits for every publish to be acknowledged or
// given up and for the subscriber to have everything the broker took before
// an end marker (no sleep), and returns what was seen.
func (l *Live) Stop(ctx context.Context) (LiveResult, error) {
	close(l.stop)
	select {
	case <-l.done:
	case <-ctx.Done():
		return LiveResult{}, fmt.Errorf("live publisher: its publishes neither acknowledged nor given up: %w", ctx.Err())
	}
	defer l.sub.Disconnect(250)
	defer l.pub.Disconnect(250)
	if err := wait(ctx, l.pub.Publish(l.topic, 1, false, "end"), "live end marker"); err != nil {
		return LiveResult{}, err
	}
	// A subscriber whose session the event lost is subscribed no more and
	// never gets the marker: its bound is an outcome, not a failure.
	missed := false
	select {
	case <-l.marker:
	case <-time.After(markerWait):
		missed = true
	case <-ctx.Done():
		return LiveResult{}, ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := LiveResult{Published: len(l.acked), Refused: l.failed, WhyRefused: l.whyFail, AckGap: l.ackGap, ReceiveGap: l.recvGap, MarkerMissed: missed}
	for n, ok := range l.acked {
		if ok {
			r.Acked++
			if l.received[n] == 0 {
				r.Lost++
			}
		}
	}
	for _, c := range l.received {
		r.Received++
		r.Duplicates += c - 1
	}
	return r, nil
}
