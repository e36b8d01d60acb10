package brokerstate

import (
	"context"
	"fmt"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Clock publishes the time to one topic as a retained QoS 1 message every
// period, so that the retained value a broker serves after an event says
// how old its retained set is: the event's time minus the value read
// (ReadClock). A value counts as published once the broker acknowledged it.
type Clock struct {
	c     mqtt.Client
	topic string
	stop  chan struct{}
	done  chan struct{}

	mu    sync.Mutex
	acked time.Time // the newest value the broker acknowledged
}

// StartClock connects a clean MQTT 3.1.1 client to addr (host:port) and
// publishes the time to topic every period until Stop; it does not
// reconnect: a broker gone ends it.
func StartClock(ctx context.Context, addr, topic string, every time.Duration) (*Clock, error) {
	c, _, err := connect(ctx, addr, topic+"-clock", true, nil)
	if err != nil {
		return nil, err
	}
	k := &Clock{c: c, topic: topic, stop: make(chan struct{}), done: make(chan struct{})}
	go k.run(every)
	return k, nil
}

// publishWait bounds the wait for one acknowledgement.
const publishWait = 2 * time.Second

func (k *Clock) run(every time.Duration) {
	defer close(k.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		now := time.Now()
		// Awaited even when stopped meanwhile, so that Stop returns the
		// value the broker holds; a dead broker's connection ends it.
		if tok := k.c.Publish(k.topic, 1, true, now.Format(time.RFC3339Nano)); tok.WaitTimeout(publishWait) && tok.Error() == nil {
			k.mu.Lock()
			k.acked = now
			k.mu.Unlock()
		}
		select {
		case <-t.C:
		case <-k.stop:
			return
		}
	}
}

// Stop ends the clock and returns the newest value the broker acknowledged
// (zero: none).
func (k *Clock) Stop() time.Time {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	k.c.Disconnect(0)
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.acked
}

// ReadClock reads the retained value of a Clock's topic from the broker at
// addr: ok is false when it holds none. A marker published after the
// subscription ends the wait (the broker sends the retained message on
// subscribing, before it).
func ReadClock(ctx context.Context, addr, topic string) (at time.Time, ok bool, err error) {
	marker := topic + "-marker"
	var (
		mu   sync.Mutex
		val  string
		done = make(chan struct{})
		once sync.Once
	)
	on := func(_ mqtt.Client, m mqtt.Message) {
		if m.Topic() == marker {
			once.Do(func() { close(done) })
			return
		}
		if m.Topic() == topic && m.Retained() {
			mu.Lock()
			val = string(m.Payload())
			mu.Unlock()
		}
	}
	c, _, err := connect(ctx, addr, topic+"-read", true, nil)
	if err != nil {
		return time.Time{}, false, err
	}
	defer c.Disconnect(0)
	if err := wait(ctx, c.SubscribeMultiple(map[string]byte{topic: 1, marker: 1}, on), "subscribe "+topic); err != nil {
		return time.Time{}, false, err
	}
	if err := wait(ctx, c.Publish(marker, 1, false, "m"), "publish marker"); err != nil {
		return time.Time{}, false, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return time.Time{}, false, fmt.Errorf("read %s: the marker never came back: %w", topic, ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	if val == "" {
		return time.Time{}, false, nil
	}
	at, err = time.Parse(time.RFC3339Nano, val)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read %s: %q is not a time: %w", topic, val, err)
	}
	return at, true, nil
}
