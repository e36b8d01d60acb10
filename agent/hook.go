package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/amf-edge/amf/podsignal"
)

// errACL is returned by intake for a publish outside the client's own topic.
var errACL = errors.New("agent: publish outside the client's own topic")

// hook is the agent's mochi hook: authentication, ACL, payload validation and
// intake, and the ends of sessions. mochi calls it from each client's own
// goroutine, so one client's packets reach it in order.
type hook struct {
	mqtt.HookBase
	ctx          context.Context // ends when the agent stops: aborts pending reviews
	auth         Authenticator
	tracker      *Tracker
	m            *metrics
	log          *slog.Logger
	maxKeepalive uint16 // seconds
	authTimeout  time.Duration
	now          func() time.Time
	adm          *admission
	replace      func(old *trackedConn) // ends a session a newer one of its pod replaced
}

func (h *hook) ID() string { return "amf-agent" }

// Provides tells mochi which events the hook handles.
func (h *hook) Provides(b byte) bool {
	switch b {
	case mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnPacketRead, mqtt.OnPublish, mqtt.OnWillSent, mqtt.OnDisconnect:
		return true
	}
	return false
}

// OnConnectAuthenticate admits a client whose token, username, client
// identifier, keepalive and Last Will all match the rules in the package
// documentation, and opens its session.
func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	attrs := []slog.Attr{
		slog.String("remote", cl.Net.Remote),
		slog.String("client_id", truncate(pk.Connect.ClientIdentifier)),
		slog.String("username", truncate(string(pk.Connect.Username))),
	}
	tc, ok := cl.Net.Conn.(*trackedConn)
	if !ok {
		return h.refuse(refuseUnsupported, errors.New("connection not accepted by the agent's listener"), attrs)
	}
	tc.cl.Store(cl)
	if !h.adm.authenticating(tc) {
		return h.refuse(refuseEvicted, errors.New("evicted while its CONNECT was read"), attrs)
	}
	if ka := pk.Connect.Keepalive; ka == 0 || ka > h.maxKeepalive {
		if cl.Properties.ProtocolVersion < 5 {
			return h.refuse(refuseKeepalive, fmt.Errorf("keepalive of %d s, want 1 to %d s", ka, h.maxKeepalive), attrs)
		}
		// MQTT 5 lets the server impose its keepalive (CONNACK Server Keep Alive).
		cl.State.Keepalive = h.maxKeepalive
		cl.State.ServerKeepalive = true
	}
	token := string(pk.Connect.Password)
	if token == "" {
		return h.refuse(refuseNoToken, errors.New("no token in the password"), attrs)
	}
	// mochi's deadline is 1.5 × keepalive, which may be shorter than a
	// TokenReview; the read loop sets it again after CONNACK.
	_ = tc.SetDeadline(h.now().Add(h.authTimeout + 2*time.Second))
	ctx, cancel := context.WithTimeout(h.ctx, h.authTimeout)
	id, err := h.auth.Authenticate(ctx, token)
	cancel()
	if err != nil {
		return h.refuse(refuseReason(err), err, attrs)
	}
	attrs = append(attrs, slog.String("pod", id.String()))
	if u := string(pk.Connect.Username); u != id.String() {
		return h.refuse(refuseUsername, fmt.Errorf("username %q, but the token is %s's", truncate(u), id), attrs)
	}
	if cid := pk.Connect.ClientIdentifier; cid != id.String() && !strings.HasPrefix(cid, id.String()+"/") {
		return h.refuse(refuseClientID, fmt.Errorf("client identifier must be %s or start with %s/", id, id), attrs)
	}
	if pk.Connect.WillFlag {
		if err := checkWill(pk, id); err != nil {
			return h.refuse(refuseWill, err, attrs)
		}
	}
	replaced, ok := h.adm.promote(tc, id)
	if !ok {
		return h.refuse(refuseCapacity, fmt.Errorf("every session slot (%d) is held by another pod", h.adm.maxSessions), attrs)
	}
	// The new session first, so that the replaced one's end reads as
	// superseded, not as the pod gone.
	sess := h.tracker.begin(id, pk.Connect.ClientIdentifier)
	if sess == nil {
		h.adm.release(tc)
		return h.refuse(refuseShutdown, errors.New("agent is shutting down"), attrs)
	}
	tc.sess.Store(sess)
	if replaced != nil {
		rattrs := []slog.Attr{slog.String("pod", id.String()), slog.String("remote", replaced.RemoteAddr().String()), slog.Uint64("session", sess.id)}
		if old := replaced.sess.Load(); old != nil {
			rattrs = append(rattrs, slog.Uint64("old_session", old.id))
		}
		h.log.LogAttrs(context.Background(), slog.LevelInfo, "session replaced", rattrs...)
		h.replace(replaced)
	}
	h.m.connAccepted.Inc()
	h.log.LogAttrs(context.Background(), slog.LevelInfo, "client connected", append(attrs,
		slog.Uint64("session", sess.id), slog.Int("keepalive_s", int(cl.State.Keepalive)),
		slog.Bool("will", pk.Connect.WillFlag))...)
	return true
}

func (h *hook) refuse(reason string, err error, attrs []slog.Attr) bool {
	h.m.connRefused.WithLabelValues(reason).Inc()
	h.log.LogAttrs(context.Background(), slog.LevelWarn, "connection refused",
		append(attrs, slog.String("reason", reason), slog.String("error", err.Error()))...)
	return false
}

// checkWill accepts only the contract's Last Will: an undelayed, valid "gone"
// on the client's own topic. The broker publishes a will without an ACL check
// or OnPublish, so this is the only place to check it.
func checkWill(pk packets.Packet, id podsignal.PodID) error {
	if pk.Connect.WillTopic != id.Topic() {
		return fmt.Errorf("will topic %q, want %q", truncate(pk.Connect.WillTopic), id.Topic())
	}
	if pk.Connect.WillProperties.WillDelayInterval > 0 {
		return errors.New("delayed will: it would delay noticing the pod is gone")
	}
	m, err := podsignal.Decode(pk.Connect.WillTopic, pk.Connect.WillPayload)
	if err != nil {
		return fmt.Errorf("will payload: %w", err)
	}
	if m.State != podsignal.Gone {
		return fmt.Errorf("will state %q, want %q", m.State, podsignal.Gone)
	}
	return nil
}

// OnACLCheck allows a client its own health topic, for publishing and
// subscribing, and its own command topic for subscribing: the agent alone
// publishes commands.
func (h *hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	sess := sessionOf(cl.Net.Conn)
	if sess != nil && (topic == sess.topic || !write && topic == sess.commandTopic) {
		return true
	}
	action := "subscribe"
	if write {
		action = "publish"
	}
	h.denied(sess, action, topic)
	return false
}

func (h *hook) denied(sess *session, action, topic string) {
	h.m.aclDenied.WithLabelValues(action).Inc()
	pod := "(unauthenticated)"
	if sess != nil {
		pod = sess.identity.String()
	}
	h.log.LogAttrs(context.Background(), slog.LevelWarn, "acl denied",
		slog.String("pod", pod), slog.String("action", action), slog.String("topic", truncate(topic)))
}

// OnPacketRead answers the publishes that mochi drops before any hook sees
// them (topics it deems invalid for publishing: $SYS/… and wildcards) the
// way the ACL answers its own denials, instead of letting them vanish: a
// QoS 1 publisher would otherwise wait forever for its PUBACK. A topic with
// a wildcard is a protocol error [MQTT-3.3.2-2]: the connection is closed,
// an MQTT 5 client told why (DISCONNECT 0x90).
func (h *hook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type != packets.Publish || cl.Net.Inline || mqtt.IsValidFilter(pk.TopicName, true) {
		return pk, nil
	}
	h.denied(sessionOf(cl.Net.Conn), "publish", pk.TopicName)
	v5 := cl.Properties.ProtocolVersion == 5
	switch {
	case strings.ContainsAny(pk.TopicName, "+#"):
		if v5 {
			_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect},
				ReasonCode: packets.ErrTopicNameInvalid.Code, Properties: packets.Properties{ReasonString: packets.ErrTopicNameInvalid.Reason}})
		}
		return pk, packets.ErrRejectPacket // closes the connection
	case pk.FixedHeader.Qos == 0:
		return pk, nil // nothing to answer with; mochi drops it
	case v5:
		if err := cl.WritePacket(negativeAck(pk, packets.ErrNotAuthorized)); err != nil {
			return pk, packets.ErrRejectPacket
		}
		return pk, nil // answered; mochi drops it
	default:
		return pk, packets.ErrRejectPacket // no negative PUBACK in MQTT 3.1.1: disconnect
	}
}

// negativeAck is the PUBACK (QoS 1) or PUBREC (QoS 2) that refuses pk with
// an MQTT 5 reason code.
func negativeAck(pk packets.Packet, code packets.Code) packets.Packet {
	t := byte(packets.Puback)
	if pk.FixedHeader.Qos == 2 {
		t = packets.Pubrec
	}
	return packets.Packet{FixedHeader: packets.FixedHeader{Type: t}, PacketID: pk.PacketID,
		ReasonCode: code.Code, Properties: packets.Properties{ReasonString: code.Reason}}
}

// OnPublish validates and records a signal. A refused payload is neither
// retained nor forwarded: MQTT 5 QoS 1 publishers get PUBACK 0x99 (payload
// format invalid); MQTT 3.1.1 ones a plain acknowledgement, which its
// protocol allows for a refused publish [MQTT-3.3.5-2]: a disconnect would
// make the pod read as gone, and a sidecar newer than its agent (a schema
// it cannot read) would then fail every pod of the node over. The agent's
// own warning is the one log line: the answer is written here and mochi
// told to drop the packet, so that it logs no error of its own.
func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil // the agent's own commands (Agent.Command)
	}
	err := h.intake(sessionOf(cl.Net.Conn), pk.TopicName, pk.Payload)
	switch {
	case err == nil:
		return pk, nil
	case errors.Is(err, errACL):
		return pk, packets.ErrRejectPacket
	case cl.Properties.ProtocolVersion == 5 && pk.FixedHeader.Qos > 0:
		if err := cl.WritePacket(negativeAck(pk, packets.ErrPayloadFormatInvalid)); err != nil {
			h.log.Debug("negative PUBACK not written", slog.String("error", err.Error()))
		}
		return pk, packets.ErrRejectPacket
	default:
		return pk, packets.CodeSuccessIgnore
	}
}

// intake checks the ACL, decodes and records one published signal: the hot
// path of the agent (BenchmarkIntake).
func (h *hook) intake(sess *session, topic string, payload []byte) error {
	start := h.now()
	// mochi has already run OnACLCheck; checking again here keeps the rule
	// next to the only code that records anything.
	if sess == nil || topic != sess.topic {
		h.denied(sess, "publish", topic)
		return errACL
	}
	msg, err := podsignal.Decode(topic, payload)
	if err != nil {
		reason := malformedReason(err)
		h.m.malformed.WithLabelValues(reason).Inc()
		h.log.LogAttrs(context.Background(), slog.LevelWarn, "malformed signal",
			slog.String("pod", sess.identity.String()), slog.Uint64("session", sess.id),
			slog.String("reason", reason), slog.Int("bytes", len(payload)), slog.String("error", err.Error()))
		return err
	}
	h.tracker.publish(sess, &msg, start)
	h.m.intake.Observe(h.now().Sub(start).Seconds())
	return nil
}

// OnWillSent records a Last Will the broker has just published.
func (h *hook) OnWillSent(cl *mqtt.Client, pk packets.Packet) {
	sess := sessionOf(cl.Net.Conn)
	if sess == nil {
		return
	}
	msg, err := podsignal.Decode(pk.TopicName, pk.Payload)
	if err != nil {
		// checkWill accepted it at connect; only a bug gets here.
		h.log.Error("will no longer decodes", slog.String("pod", sess.identity.String()), slog.String("error", err.Error()))
		return
	}
	h.tracker.will(sess, &msg, h.now())
}

// OnDisconnect ends the client's session; err is nil after a DISCONNECT.
func (h *hook) OnDisconnect(cl *mqtt.Client, err error, _ bool) {
	sess := sessionOf(cl.Net.Conn)
	if sess == nil {
		return
	}
	attrs := []slog.Attr{slog.String("pod", sess.identity.String()), slog.String("client_id", truncate(sess.clientID)),
		slog.Uint64("session", sess.id), slog.Bool("clean", err == nil)}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	if errors.Is(err, packets.ErrPacketTooLarge) {
		h.m.malformed.WithLabelValues(malformedPacketTooLarge).Inc()
		h.log.LogAttrs(context.Background(), slog.LevelWarn, "malformed signal",
			slog.String("pod", sess.identity.String()), slog.Uint64("session", sess.id),
			slog.String("reason", malformedPacketTooLarge), slog.Int("max_bytes", MaxPacketBytes))
	}
	h.log.LogAttrs(context.Background(), slog.LevelInfo, "client disconnected", attrs...)
	h.tracker.end(sess, err == nil)
}
