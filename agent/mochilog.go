package agent

import (
	"context"
	"log/slog"

	"github.com/mochi-mqtt/server/v2/packets"
)

// mochiHandler is the log handler given to mochi. It raises the level (mochi
// logs every connection at info, and a short keepalive at warn, which the
// agent's own lines already cover) and replaces packets by a summary: a
// CONNECT packet carries the token in its password field, and tokens must
// never reach a log.
type mochiHandler struct {
	inner slog.Handler
	min   slog.Level
}

func (h mochiHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.inner.Enabled(ctx, l)
}

func (h mochiHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

func (h mochiHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		red[i] = redactAttr(a)
	}
	return mochiHandler{inner: h.inner.WithAttrs(red), min: h.min}
}

func (h mochiHandler) WithGroup(name string) slog.Handler {
	return mochiHandler{inner: h.inner.WithGroup(name), min: h.min}
}

// redactAttr replaces a packet by its type, topic, packet id and sizes.
func redactAttr(a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindAny {
		return a
	}
	var pk *packets.Packet
	switch v := a.Value.Any().(type) {
	case packets.Packet:
		pk = &v
	case *packets.Packet:
		pk = v
	default:
		return a
	}
	if pk == nil {
		return a
	}
	return slog.Group(a.Key,
		slog.Int("type", int(pk.FixedHeader.Type)),
		slog.String("topic", truncate(pk.TopicName)),
		slog.Int("packet_id", int(pk.PacketID)),
		slog.Int("payload_bytes", len(pk.Payload)))
}
