package brokerstate

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// sessionPresent5 connects as an MQTT 5 client with clean start 0 and a
// session expiry, reads the CONNACK's Session Present flag, and leaves
// without taking anything: it closes the connection before acknowledging
// what the broker may start to send, so the session's queued messages stay
// queued (sent again with DUP to the session's next connection). mosquitto_sub
// does not show the flag; the packets are mochi's encoder and decoder.
func sessionPresent5(ctx context.Context, addr, id string) (bool, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false, fmt.Errorf("MQTT 5 connect %s: %w", id, err)
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	connect := packets.Packet{
		ProtocolVersion: 5,
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		Connect:         packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: false, Keepalive: 30, ClientIdentifier: id},
		Properties:      packets.Properties{SessionExpiryInterval: 3600, SessionExpiryIntervalFlag: true},
	}
	var buf bytes.Buffer
	if err := connect.ConnectEncode(&buf); err != nil {
		return false, err
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return false, fmt.Errorf("MQTT 5 connect %s: %w", id, err)
	}
	r := bufio.NewReader(conn)
	b, err := r.ReadByte()
	if err != nil {
		return false, fmt.Errorf("MQTT 5 connect %s: no CONNACK: %w", id, err)
	}
	pk := packets.Packet{ProtocolVersion: 5}
	if err := pk.FixedHeader.Decode(b); err != nil || pk.FixedHeader.Type != packets.Connack {
		return false, fmt.Errorf("MQTT 5 connect %s: first packet of type %d, not CONNACK (%v)", id, pk.FixedHeader.Type, err)
	}
	n, _, err := packets.DecodeLength(r)
	if err != nil {
		return false, err
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return false, err
	}
	if err := pk.ConnackDecode(body); err != nil {
		return false, err
	}
	if pk.ReasonCode != 0 {
		return false, fmt.Errorf("MQTT 5 connect %s: refused, reason 0x%02x", id, pk.ReasonCode)
	}
	return pk.SessionPresent, nil
}
