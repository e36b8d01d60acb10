package agent

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/amf-edge/amf/podsignal"
)

// rawClient speaks MQTT 5 with mochi's own packet codec: paho.mqtt.golang
// speaks 3.1.1 only, and the agent answers MQTT 5 clients differently.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(waitFor)) // bounds every read below
	return &rawClient{t: t, conn: conn, r: bufio.NewReader(conn)}
}

func (c *rawClient) send(encode func(*bytes.Buffer) error) {
	c.t.Helper()
	var buf bytes.Buffer
	if err := encode(&buf); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.conn.Write(buf.Bytes()); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next packet from the broker with its body undecoded.
func (c *rawClient) read() (packets.Packet, []byte) {
	c.t.Helper()
	b, err := c.r.ReadByte()
	if err != nil {
		c.t.Fatal(err)
	}
	pk := packets.Packet{ProtocolVersion: 5}
	if err := pk.FixedHeader.Decode(b); err != nil {
		c.t.Fatal(err)
	}
	n, _, err := packets.DecodeLength(c.r)
	if err != nil {
		c.t.Fatal(err)
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		c.t.Fatal(err)
	}
	return pk, body
}

func (c *rawClient) publish(id uint16, topic string, body []byte) packets.Packet {
	c.t.Helper()
	pk := packets.Packet{
		ProtocolVersion: 5,
		FixedHeader:     packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
		TopicName:       topic, PacketID: id, Payload: body,
	}
	c.send(pk.PublishEncode)
	ack, raw := c.read()
	if ack.FixedHeader.Type != packets.Puback {
		c.t.Fatalf("got packet type %d, want PUBACK", ack.FixedHeader.Type)
	}
	if err := ack.PubackDecode(raw); err != nil {
		c.t.Fatal(err)
	}
	return ack
}

func TestMQTT5ClientsGetReasonCodesAndTheServerKeepalive(t *testing.T) {
	ta := startAgent(t, nil)
	c := dialRaw(t, ta.MQTTAddr())
	connect := packets.Packet{
		ProtocolVersion: 5,
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 0, // asks for no keepalive
			ClientIdentifier: podA.String(),
			UsernameFlag:     true, Username: []byte(podA.String()),
			PasswordFlag: true, Password: []byte(tokenA),
		},
	}
	c.send(connect.ConnectEncode)
	ack, raw := c.read()
	if err := ack.ConnackDecode(raw); err != nil {
		t.Fatal(err)
	}
	if ack.ReasonCode != 0 || !ack.Properties.ServerKeepAliveFlag || ack.Properties.ServerKeepAlive != 60 {
		t.Fatalf("CONNACK reason %#x, server keepalive %v %d; want success and a 60 s server keepalive",
			ack.ReasonCode, ack.Properties.ServerKeepAliveFlag, ack.Properties.ServerKeepAlive)
	}

	if ack := c.publish(1, podA.Topic(), []byte("not a signal")); ack.ReasonCode != packets.ErrPayloadFormatInvalid.Code {
		t.Errorf("malformed payload: PUBACK reason %#x, want %#x", ack.ReasonCode, packets.ErrPayloadFormatInvalid.Code)
	}
	// MQTT 5 has a negative PUBACK for the ACL too, so the client stays connected.
	if ack := c.publish(2, podB.Topic(), payload(t, podB, podsignal.Unhealthy, 1)); ack.ReasonCode != packets.ErrNotAuthorized.Code {
		t.Errorf("publish to another pod: PUBACK reason %#x, want %#x", ack.ReasonCode, packets.ErrNotAuthorized.Code)
	}
	valid := payload(t, podA, podsignal.Healthy, 1)
	if ack := c.publish(3, podA.Topic(), valid); ack.ReasonCode != 0 {
		t.Errorf("valid signal: PUBACK reason %#x", ack.ReasonCode)
	}
	if ev := ta.nextEvent(t, podA); ev.State != podsignal.Healthy || ev.Message.Seq != 1 {
		t.Fatalf("first event = %+v, want the valid signal", ev)
	}
	if got := ta.server.Topics.Messages(podA.Topic()); len(got) != 1 || !bytes.Equal(got[0].Payload, valid) {
		t.Errorf("retained %d messages, want only the valid one", len(got))
	}
	if got := ta.server.Topics.Messages(podB.Topic()); len(got) != 0 {
		t.Errorf("podB's topic retained %d messages", len(got))
	}
	if got := testutil.ToFloat64(ta.m.malformed.WithLabelValues(malformedInvalid)); got != 1 {
		t.Errorf("malformed = %v, want 1", got)
	}
	if got := testutil.ToFloat64(ta.m.aclDenied.WithLabelValues("publish")); got != 1 {
		t.Errorf("acl denials = %v, want 1", got)
	}
}

func TestFrozenSidecarIsGoneAfterItsKeepalive(t *testing.T) {
	ta := startAgent(t, nil)
	c := dialRaw(t, ta.MQTTAddr())
	connect := packets.Packet{
		ProtocolVersion: 4,
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 1,
			ClientIdentifier: podA.String(),
			UsernameFlag:     true, Username: []byte(podA.String()),
			PasswordFlag: true, Password: []byte(tokenA),
		},
	}
	c.send(connect.ConnectEncode)
	if ack, _ := c.read(); ack.FixedHeader.Type != packets.Connack {
		t.Fatalf("got packet type %d, want CONNACK", ack.FixedHeader.Type)
	}
	start := time.Now()
	// From now on the client sends nothing, not even PINGREQ: frozen.
	ev := ta.nextEvent(t, podA)
	if ev.Source != podsignal.SourceDisconnect || ev.State != podsignal.Gone {
		t.Fatalf("event = %+v, want gone by disconnect", ev)
	}
	// mochi's deadline is keepalive + keepalive/2 in whole seconds: 1 s here.
	if d := time.Since(start); d < 900*time.Millisecond || d > 5*time.Second {
		t.Errorf("frozen client noticed after %v, want about 1 s", d)
	}
}

func TestAConnectionThatNeverSendsCONNECTIsClosed(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.ConnectTimeout = 200 * time.Millisecond; c.MaxClients = 1 })
	c := dialRaw(t, ta.MQTTAddr())
	if _, err := c.r.ReadByte(); err == nil {
		t.Fatal("read a byte, want the connection closed")
	}
	// The slot is free again: a real client gets in.
	ta.logs.wait(t, "the slot released", lineIs("connection closed", "remote", c.conn.LocalAddr().String()))
	mustDial(t, ta.MQTTAddr(), podA, tokenA, nil)
}
