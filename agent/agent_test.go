package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/amf-edge/amf/podsignal"
)

func TestAuthenticatedSignalIsRecordedAndLoggedOncePerTransition(t *testing.T) {
	ta := startAgent(t, nil)
	c := mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)

	publish(t, c, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
	ev := ta.nextEvent(t, podA)
	if !ev.Transition || ev.State != podsignal.Healthy || ev.Previous != "" || ev.Source != podsignal.SourcePublish || ev.Message.Seq != 1 {
		t.Fatalf("first event = %+v, want a transition to healthy from publish, seq 1", ev)
	}
	st, ok := ta.Tracker().Pod(podA)
	if !ok || st.State != podsignal.Healthy || !st.Connected || st.Message == nil || st.Message.Seq != 1 || st.Received.IsZero() {
		t.Fatalf("pod state = %+v, want healthy, connected, seq 1", st)
	}

	// Same state again: an event for the debounce, not a transition.
	publish(t, c, podA.Topic(), payload(t, podA, podsignal.Healthy, 2))
	if ev := ta.nextEvent(t, podA); ev.Transition || ev.State != podsignal.Healthy || ev.Message.Seq != 2 {
		t.Fatalf("repeat event = %+v, want healthy without transition, seq 2", ev)
	}
	// A duplicate seq (QoS 1 redelivery) is ignored: the next event is seq 3.
	publish(t, c, podA.Topic(), payload(t, podA, podsignal.Anomalous, 2))
	publish(t, c, podA.Topic(), payload(t, podA, podsignal.Anomalous, 3))
	if ev := ta.nextEvent(t, podA); !ev.Transition || ev.State != podsignal.Anomalous || ev.Message.Seq != 3 {
		t.Fatalf("event after a duplicate = %+v, want the transition to anomalous of seq 3", ev)
	}
	if n := testutil.ToFloat64(ta.m.ignored.WithLabelValues(ignoredDuplicate)); n != 1 {
		t.Errorf("duplicates ignored = %v, want 1", n)
	}

	line := ta.logs.wait(t, "transition to anomalous", lineIs("transition", "pod", "broker-a", "to", "anomalous"))
	if line["namespace"] != "tod" || line["from"] != "healthy" || line["source"] != "publish" || line["seq"] != 3.0 || line["probability"] != 0.9 {
		t.Errorf("transition line = %v", line)
	}
	if n := len(ta.logs.match(lineIs("transition", "pod", "broker-a"))); n != 2 {
		t.Errorf("%d transition lines, want 2 (healthy, anomalous):\n%s", n, strings.Join(ta.logs.rawLines(), "\n"))
	}
	if got := testutil.ToFloat64(ta.m.connAccepted); got != 1 {
		t.Errorf("connections accepted = %v, want 1", got)
	}
	if got := testutil.ToFloat64(ta.m.pods.WithLabelValues("anomalous")); got != 1 {
		t.Errorf("pods anomalous = %v, want 1", got)
	}
	if got := testutil.ToFloat64(ta.m.pods.WithLabelValues("healthy")); got != 0 {
		t.Errorf("pods healthy = %v, want 0", got)
	}
	if got := testutil.CollectAndCount(ta.m.intake); got != 1 {
		t.Errorf("intake histogram series = %d", got)
	}
}

func TestConnectionsAreRefusedAndCounted(t *testing.T) {
	ta := startAgent(t, nil)
	will := func(topic string, body []byte) func(*paho.ClientOptions) {
		return func(o *paho.ClientOptions) { o.SetBinaryWill(topic, body, 1, true) }
	}
	tests := []struct {
		name   string
		id     podsignal.PodID
		token  string
		mod    func(*paho.ClientOptions)
		reason string
	}{
		{"wrong token", podA, "not-a-token-of-the-file", nil, refuseBadToken},
		{"token of another pod", podA, tokenB, nil, refuseUsername},
		{"no token", podA, "", nil, refuseNoToken},
		{"client id of another pod", podA, tokenA, func(o *paho.ClientOptions) { o.SetClientID(podB.String()) }, refuseClientID},
		{"client id sharing a prefix", podA, tokenA, func(o *paho.ClientOptions) { o.SetClientID(podA.String() + "x") }, refuseClientID},
		{"no keepalive", podA, tokenA, func(o *paho.ClientOptions) { o.SetKeepAlive(0) }, refuseKeepalive},
		{"keepalive above the maximum", podA, tokenA, func(o *paho.ClientOptions) { o.SetKeepAlive(61e9) }, refuseKeepalive},
		{"will on another pod's topic", podA, tokenA, will(podB.Topic(), payload(t, podB, podsignal.Gone, 0)), refuseWill},
		{"will that is not gone", podA, tokenA, will(podA.Topic(), payload(t, podA, podsignal.Healthy, 0)), refuseWill},
		{"will that is not a signal", podA, tokenA, will(podA.Topic(), []byte("bye")), refuseWill},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testutil.ToFloat64(ta.m.connRefused.WithLabelValues(tt.reason))
			if _, err := dial(t, ta.MQTTAddr(), tt.id, tt.token, tt.mod); err == nil {
				t.Fatal("connected, want a refusal")
			} else if !strings.Contains(err.Error(), "not Authorized") {
				t.Errorf("error = %v, want CONNACK not authorized", err)
			}
			if got := testutil.ToFloat64(ta.m.connRefused.WithLabelValues(tt.reason)); got != before+1 {
				t.Errorf("refused{reason=%s} = %v, want %v", tt.reason, got, before+1)
			}
		})
	}
	if got := testutil.ToFloat64(ta.m.connAccepted); got != 0 {
		t.Errorf("connections accepted = %v, want 0", got)
	}
	if n := len(ta.logs.match(lineIs("connection refused"))); n != len(tests) {
		t.Errorf("%d refusal lines, want %d", n, len(tests))
	}
	// Once the token proves an identity, the refusal names it.
	ta.logs.wait(t, "naming the pod", lineIs("connection refused", "reason", refuseClientID, "pod", podA.String()))
	if pods := ta.Tracker().Pods(); len(pods) != 0 {
		t.Errorf("refused clients left pods behind: %+v", pods)
	}
}

func TestConnectionsAboveTheLimitAreRefused(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.MaxClients = 1 })
	mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)
	if _, err := dial(t, ta.MQTTAddr(), podB, tokenB, nil); err == nil {
		t.Fatal("second client connected above MaxClients=1")
	}
	if got := testutil.ToFloat64(ta.m.connRefused.WithLabelValues(refuseCapacity)); got != 1 {
		t.Errorf("refused{capacity} = %v, want 1", got)
	}
}

func TestPublishingToAnotherPodsTopicIsRefused(t *testing.T) {
	ta := startAgent(t, nil)
	c := mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)

	// QoS 0: dropped silently. The QoS 1 publish after it on the same
	// connection is processed after it, so its event proves the first is done.
	if tok := c.Publish(podB.Topic(), 0, true, payload(t, podB, podsignal.Unhealthy, 1)); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("QoS 0 publish: %v", tok.Error())
	}
	publish(t, c, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
	if ev := ta.nextEvent(t, podA); ev.State != podsignal.Healthy {
		t.Fatalf("event = %+v", ev)
	}
	if got := testutil.ToFloat64(ta.m.aclDenied.WithLabelValues("publish")); got != 1 {
		t.Errorf("acl denials = %v, want 1", got)
	}

	// QoS 1: MQTT 3.1.1 has no negative PUBACK, so the broker disconnects the
	// offender; its pod is then gone.
	c.Publish(podB.Topic(), 1, true, payload(t, podB, podsignal.Unhealthy, 2))
	if ev := ta.nextEvent(t, podA); ev.Source != podsignal.SourceDisconnect || ev.State != podsignal.Gone {
		t.Fatalf("event = %+v, want podA gone by disconnect", ev)
	}
	if got := testutil.ToFloat64(ta.m.aclDenied.WithLabelValues("publish")); got != 2 {
		t.Errorf("acl denials = %v, want 2", got)
	}
	if _, ok := ta.Tracker().Pod(podB); ok {
		t.Error("podB was recorded from podA's publish")
	}
	if got := ta.server.Topics.Messages(podB.Topic()); len(got) != 0 {
		t.Errorf("podB's topic retained %d messages", len(got))
	}
	if n := testutil.ToFloat64(ta.m.messages.WithLabelValues("unhealthy", "publish")); n != 0 {
		t.Errorf("unhealthy messages counted: %v", n)
	}
	ta.logs.wait(t, "acl denied with the identity", lineIs("acl denied", "pod", podA.String(), "action", "publish", "topic", podB.Topic()))
}

func TestSubscribingIsRefusedExceptToTheOwnTopic(t *testing.T) {
	ta := startAgent(t, nil)
	c := mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)
	publish(t, c, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
	ta.nextEvent(t, podA)

	for _, filter := range []string{"amf/#", "#", podB.Topic(), "amf/v1/tod/+/health", "$SYS/#"} {
		tok := c.Subscribe(filter, 1, nil)
		if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", filter, tok.Error())
		}
		if code := tok.(*paho.SubscribeToken).Result()[filter]; code != 0x80 {
			t.Errorf("subscribe %s: return code %#x, want 0x80 (failure)", filter, code)
		}
	}
	if got := testutil.ToFloat64(ta.m.aclDenied.WithLabelValues("subscribe")); got != 5 {
		t.Errorf("subscribe denials = %v, want 5", got)
	}

	// The own topic is allowed, and delivers the sidecar's own retained state.
	got := make(chan []byte, 1)
	tok := c.Subscribe(podA.Topic(), 1, func(_ paho.Client, m paho.Message) { got <- m.Payload() })
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscribe own topic: %v", tok.Error())
	}
	if code := tok.(*paho.SubscribeToken).Result()[podA.Topic()]; code != 1 {
		t.Errorf("own topic: return code %#x, want 1", code)
	}
	select {
	case b := <-got:
		if m, err := podsignal.Decode(podA.Topic(), b); err != nil || m.State != podsignal.Healthy {
			t.Errorf("retained message = %s (%v)", b, err)
		}
	case <-timeout():
		t.Fatal("own retained message not delivered")
	}
}

func TestMalformedPayloadsAreDroppedCountedAndNotRetained(t *testing.T) {
	ta := startAgent(t, nil)
	c := mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)
	valid := string(payload(t, podA, podsignal.Healthy, 1))
	bad := []struct {
		body   string
		reason string
	}{
		{"healthy", malformedInvalid},
		{strings.Replace(valid, `"seq":1,`, ``, 1), malformedInvalid},
		{`{"reason":"` + strings.Repeat("x", podsignal.MaxMessageBytes) + `"}`, malformedTooLarge},
		{string(payload(t, podB, podsignal.Healthy, 1)), malformedIdentity},
	}
	for _, b := range bad {
		// Acknowledged (MQTT 3.1.1 has no negative PUBACK), so a client does
		// not resend it forever; dropped all the same.
		publish(t, c, podA.Topic(), []byte(b.body))
	}
	for _, reason := range []string{malformedInvalid, malformedTooLarge, malformedIdentity} {
		want := 0.0
		for _, b := range bad {
			if b.reason == reason {
				want++
			}
		}
		if got := testutil.ToFloat64(ta.m.malformed.WithLabelValues(reason)); got != want {
			t.Errorf("malformed{reason=%s} = %v, want %v", reason, got, want)
		}
	}
	if got := ta.server.Topics.Messages(podA.Topic()); len(got) != 0 {
		t.Errorf("a malformed payload was retained: %q", got[0].Payload)
	}
	if st, _ := ta.Tracker().Pod(podA); st.State != "" || st.Message != nil {
		t.Errorf("malformed payloads were recorded: %+v", st)
	}
	ta.logs.wait(t, "malformed signal with the identity", lineIs("malformed signal", "pod", podA.String(), "reason", malformedTooLarge))

	// The first event is the valid message that follows: nothing before it.
	publish(t, c, podA.Topic(), []byte(valid))
	if ev := ta.nextEvent(t, podA); ev.State != podsignal.Healthy || ev.Message.Seq != 1 {
		t.Fatalf("first event = %+v, want the valid healthy message", ev)
	}
	if got := ta.server.Topics.Messages(podA.Topic()); len(got) != 1 || string(got[0].Payload) != valid {
		t.Errorf("retained = %v, want the valid message", got)
	}

	// Above the broker's packet limit the connection is closed.
	c.Publish(podA.Topic(), 1, true, make([]byte, MaxPacketBytes))
	if ev := ta.nextEvent(t, podA); ev.Source != podsignal.SourceDisconnect || ev.State != podsignal.Gone {
		t.Fatalf("event = %+v, want gone by disconnect", ev)
	}
	if got := testutil.ToFloat64(ta.m.malformed.WithLabelValues(malformedPacketTooLarge)); got != 1 {
		t.Errorf("malformed{packet_too_large} = %v, want 1", got)
	}
}

func TestKilledSidecarIsGoneByWillAndByDisconnect(t *testing.T) {
	ta := startAgent(t, nil)

	// With a Last Will: the will says gone, then the end of the session
	// confirms it (an event, not a second transition).
	a := mustDial(t, ta.MQTTAddr(), podA, tokenA, func(o *paho.ClientOptions) {
		o.SetBinaryWill(podA.Topic(), payload(t, podA, podsignal.Gone, 0), 1, true)
	})
	publish(t, a, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
	ta.nextEvent(t, podA)
	a.kill(t)
	if ev := ta.nextEvent(t, podA); ev.Source != podsignal.SourceWill || ev.State != podsignal.Gone || !ev.Transition || ev.Previous != podsignal.Healthy {
		t.Fatalf("event = %+v, want a transition to gone by the will", ev)
	}
	if ev := ta.nextEvent(t, podA); ev.Source != podsignal.SourceDisconnect || ev.State != podsignal.Gone || ev.Transition {
		t.Fatalf("event = %+v, want the disconnect, already gone", ev)
	}
	if st, _ := ta.Tracker().Pod(podA); st.State != podsignal.Gone || st.Connected || st.Source != podsignal.SourceDisconnect {
		t.Errorf("pod state = %+v", st)
	}
	ta.logs.wait(t, "transition to gone", lineIs("transition", "pod", "broker-a", "to", "gone", "source", "will"))

	// Without a will, the broker's own view of the session suffices.
	b := mustDial(t, ta.MQTTAddr(), podB, tokenB, nil)
	publish(t, b, podB.Topic(), payload(t, podB, podsignal.Anomalous, 7))
	ta.nextEvent(t, podB)
	b.kill(t)
	if ev := ta.nextEvent(t, podB); ev.Source != podsignal.SourceDisconnect || ev.State != podsignal.Gone || !ev.Transition {
		t.Fatalf("event = %+v, want a transition to gone by disconnect", ev)
	}
	if got := testutil.ToFloat64(ta.m.disconnects.WithLabelValues("unclean")); got != 2 {
		t.Errorf("unclean disconnects = %v, want 2", got)
	}
	if got := testutil.ToFloat64(ta.m.pods.WithLabelValues("gone")); got != 2 {
		t.Errorf("pods gone = %v, want 2", got)
	}
}

func TestOrderlyStopStaysStopping(t *testing.T) {
	ta := startAgent(t, nil)
	withWill := func(id podsignal.PodID) func(*paho.ClientOptions) {
		return func(o *paho.ClientOptions) { o.SetBinaryWill(id.Topic(), payload(t, id, podsignal.Gone, 0), 1, true) }
	}
	a := mustDial(t, ta.MQTTAddr(), podA, tokenA, withWill(podA))
	publish(t, a, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
	publish(t, a, podA.Topic(), payload(t, podA, podsignal.Stopping, 2))
	ta.nextEvent(t, podA)
	ta.nextEvent(t, podA)
	a.Disconnect(250)
	ev := ta.nextEvent(t, podA)
	if ev.Source != podsignal.SourceDisconnect || ev.State != podsignal.Stopping || ev.Transition {
		t.Fatalf("event = %+v, want the disconnect keeping stopping", ev)
	}
	if st, _ := ta.Tracker().Pod(podA); st.State != podsignal.Stopping || st.Connected {
		t.Errorf("pod state = %+v, want stopping, disconnected", st)
	}
	// A clean DISCONNECT without stopping first is still the end of the pod's
	// signals: gone.
	b := mustDial(t, ta.MQTTAddr(), podB, tokenB, withWill(podB))
	publish(t, b, podB.Topic(), payload(t, podB, podsignal.Healthy, 1))
	ta.nextEvent(t, podB)
	b.Disconnect(250)
	if ev := ta.nextEvent(t, podB); ev.Source != podsignal.SourceDisconnect || ev.State != podsignal.Gone {
		t.Fatalf("event = %+v, want gone by disconnect", ev)
	}
	if got := testutil.ToFloat64(ta.m.disconnects.WithLabelValues("clean")); got != 2 {
		t.Errorf("clean disconnects = %v, want 2", got)
	}
	if got := testutil.ToFloat64(ta.m.messages.WithLabelValues("gone", "will")); got != 0 {
		t.Errorf("wills sent after a clean disconnect: %v", got)
	}
}

func TestANewSessionReplacesTheOldOne(t *testing.T) {
	t.Run("same client id takes over", func(t *testing.T) {
		ta := startAgent(t, nil)
		withWill := func(o *paho.ClientOptions) {
			o.SetBinaryWill(podA.Topic(), payload(t, podA, podsignal.Gone, 0), 1, true)
		}
		old := mustDial(t, ta.MQTTAddr(), podA, tokenA, withWill)
		publish(t, old, podA.Topic(), payload(t, podA, podsignal.Healthy, 10))
		first := ta.nextEvent(t, podA)

		// The restarted sidecar counts from 1 again: a new run.
		next := mustDial(t, ta.MQTTAddr(), podA, tokenA, withWill)
		ta.logs.wait(t, "the old session's end", lineIs("session of a replaced connection ended", "session", "1"))
		publish(t, next, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
		ev := ta.nextEvent(t, podA)
		if ev.Source != podsignal.SourcePublish || ev.Message.Seq != 1 || ev.Session == first.Session {
			t.Fatalf("event = %+v; the old session's will or disconnect got through, or seq 1 of a new run was refused", ev)
		}
		if st, _ := ta.Tracker().Pod(podA); st.State != podsignal.Healthy || !st.Connected {
			t.Errorf("pod state = %+v, want healthy and connected", st)
		}
		// Whether mochi publishes the old session's will on a takeover depends on
		// timing; if it does, it must not count (it is superseded).
		if got := testutil.ToFloat64(ta.m.messages.WithLabelValues("gone", "will")); got != 0 {
			t.Errorf("old session's will accepted %v times after the takeover", got)
		}
	})
	t.Run("second client id replaces the old connection", func(t *testing.T) {
		// One session per pod: a second client id of the same pod replaces
		// the first instead of holding a second slot (one pod's token cannot
		// fill the broker), and the replaced session's end is not the pod gone.
		ta := startAgent(t, nil)
		lost := make(chan error, 1)
		old := mustDial(t, ta.MQTTAddr(), podA, tokenA, func(o *paho.ClientOptions) {
			o.SetConnectionLostHandler(func(_ paho.Client, err error) { lost <- err })
		})
		publish(t, old, podA.Topic(), payload(t, podA, podsignal.Unhealthy, 5))
		first := ta.nextEvent(t, podA)
		next := mustDial(t, ta.MQTTAddr(), podA, tokenA, func(o *paho.ClientOptions) { o.SetClientID(podA.String() + "/run-2") })
		select {
		case <-lost:
		case <-timeout():
			t.Fatal("the replaced connection was not closed")
		}
		ta.logs.wait(t, "the replacement", lineIs("session replaced", "pod", podA.String(), "old_session", fmt.Sprint(first.Session)))
		ta.logs.wait(t, "the old session's end", lineIs("session of a replaced connection ended"))
		publish(t, next, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
		if ev := ta.nextEvent(t, podA); ev.State != podsignal.Healthy || ev.Session == first.Session {
			t.Fatalf("event = %+v, want the new session's healthy signal, nothing between", ev)
		}
		if st, _ := ta.Tracker().Pod(podA); st.State != podsignal.Healthy || !st.Connected {
			t.Errorf("pod state = %+v, want healthy and connected", st)
		}
		if got := testutil.ToFloat64(ta.m.disconnects.WithLabelValues("superseded")); got != 1 {
			t.Errorf("superseded disconnects = %v, want 1", got)
		}
	})
}

func TestShutdownDoesNotMarkPodsGone(t *testing.T) {
	ta := startAgent(t, nil)
	c := mustDial(t, ta.MQTTAddr(), podA, tokenA, func(o *paho.ClientOptions) {
		o.SetBinaryWill(podA.Topic(), payload(t, podA, podsignal.Gone, 0), 1, true)
	})
	publish(t, c, podA.Topic(), payload(t, podA, podsignal.Healthy, 1))
	ta.nextEvent(t, podA)
	ta.stop()
	for ev := range ta.events {
		t.Errorf("event after shutdown: %+v", ev)
	}
	if st, _ := ta.Tracker().Pod(podA); st.State != podsignal.Healthy {
		t.Errorf("pod state after the agent stopped = %+v, want healthy", st)
	}
}

func TestHTTPEndpoints(t *testing.T) {
	ta := startAgent(t, nil)
	get := func(path string) (int, string) {
		t.Helper()
		res, err := http.Get("http://" + ta.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, string(b)
	}
	code, body := get("/healthz")
	var h struct {
		Status string `json:"status"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &h) != nil || h.Status != "ok" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	code, body = get("/metrics")
	for _, want := range []string{
		`amf_agent_connections_refused_total{reason="bad_token"} 0`,
		`amf_agent_acl_denials_total{action="publish"} 0`,
		`amf_agent_malformed_payloads_total{reason="invalid"} 0`,
		`amf_agent_messages_total{source="publish",state="anomalous"} 0`,
		`amf_agent_pods{state="gone"} 0`,
		`amf_agent_intake_seconds_bucket`,
		`process_cpu_seconds_total`,
	} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestHealthzPhases: /healthz names the phase, so a probe (or a person) can
// tell an agent still starting from one going away.
func TestHealthzPhases(t *testing.T) {
	a, err := New(Config{MQTTAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authenticator: staticTokens(t, tokenA+" "+podA.String())})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		phase    int32
		wantCode int
		want     string
	}{
		{"starting is 503 starting", phaseStarting, http.StatusServiceUnavailable, "starting"},
		{"serving is 200 ok", phaseServing, http.StatusOK, "ok"},
		{"stopping is 503 stopping", phaseStopping, http.StatusServiceUnavailable, "stopping"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a.phase.Store(tt.phase)
			w := httptest.NewRecorder()
			a.healthz(w, httptest.NewRequest("GET", "/healthz", nil))
			var h struct {
				Status string `json:"status"`
			}
			if w.Code != tt.wantCode || json.Unmarshal(w.Body.Bytes(), &h) != nil || h.Status != tt.want {
				t.Errorf("/healthz = %d %q, want %d status %q", w.Code, w.Body.String(), tt.wantCode, tt.want)
			}
		})
	}
}

func TestCommandsReachOnlyTheirPodAndOutliveADisconnect(t *testing.T) {
	ta := startAgent(t, nil)
	fence := podsignal.Command{Namespace: podA.Namespace, Pod: podA.Pod, Fence: true, Time: time.Now(), Reason: "cut off"}
	if err := ta.Command(fence); err != nil {
		t.Fatal(err)
	}
	subscribe := func(c *client, id podsignal.PodID) (chan podsignal.Command, byte) {
		got := make(chan podsignal.Command, 4)
		tok := c.Subscribe(id.CommandTopic(), 1, func(_ paho.Client, m paho.Message) {
			cmd, err := podsignal.DecodeCommand(m.Topic(), m.Payload())
			if err != nil {
				t.Errorf("command on %s does not decode: %v", m.Topic(), err)
				return
			}
			got <- cmd
		})
		if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			t.Fatalf("subscribe %s: %v", id.CommandTopic(), tok.Error())
		}
		return got, tok.(*paho.SubscribeToken).Result()[id.CommandTopic()]
	}
	next := func(got chan podsignal.Command, what string) podsignal.Command {
		t.Helper()
		select {
		case c := <-got:
			return c
		case <-timeout():
			t.Fatalf("%s: no command", what)
			return podsignal.Command{}
		}
	}

	a := mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)
	if _, code := subscribe(a, podB); code != 0x80 {
		t.Errorf("podA subscribing to podB's commands: return code %#x, want 0x80", code)
	}
	gotA, code := subscribe(a, podA)
	if code != 1 {
		t.Fatalf("own command topic: return code %#x, want 1", code)
	}
	if c := next(gotA, "the retained fence"); !c.Fence || c.Reason != "cut off" {
		t.Errorf("retained command = %+v, want the fence", c)
	}
	b := mustDial(t, ta.MQTTAddr(), podB, tokenB, nil)
	gotB, _ := subscribe(b, podB)

	// Only the agent publishes commands: a sidecar's own is refused (QoS 0:
	// dropped), so the next one the sidecar gets is the agent's.
	forged, _ := podsignal.EncodeCommand(&podsignal.Command{Version: podsignal.Version, Namespace: podA.Namespace, Pod: podA.Pod, Time: time.Now()})
	if tok := a.Publish(podA.CommandTopic(), 0, true, forged); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	publish(t, a, podA.Topic(), payload(t, podA, podsignal.Healthy, 1)) // processed after the forged one
	ta.nextEvent(t, podA)
	if got := testutil.ToFloat64(ta.m.aclDenied.WithLabelValues("publish")); got != 1 {
		t.Errorf("publish denials = %v, want 1 (the forged command)", got)
	}
	if err := ta.Command(podsignal.Command{Namespace: podA.Namespace, Pod: podA.Pod, Fence: false, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if c := next(gotA, "the unfence"); c.Fence {
		t.Errorf("command = %+v, want the unfence", c)
	}
	select {
	case c := <-gotB:
		t.Errorf("podB got podA's command %+v", c)
	default:
	}

	// A sidecar that reconnects gets the newest command, retained.
	a.kill(t)
	a2 := mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)
	gotA2, _ := subscribe(a2, podA)
	if c := next(gotA2, "the retained unfence after a reconnect"); c.Fence {
		t.Errorf("retained after reconnect = %+v, want the unfence", c)
	}
	if got := testutil.ToFloat64(ta.m.commands.WithLabelValues("fence")); got != 1 {
		t.Errorf("fence commands = %v, want 1", got)
	}
	if err := ta.Command(podsignal.Command{Namespace: "Bad", Pod: "x", Time: time.Now()}); err == nil {
		t.Error("an invalid command was published")
	}
}
