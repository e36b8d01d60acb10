// Package broker runs a plain mochi MQTT broker as a process of its own: the lab's
// stand-in for a data-plane broker where Mosquitto is not installed. Test
// infrastructure; product code never imports it.
package broker

import (
	"context"
	"fmt"
	"log/slog"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Run serves MQTT on addr, allowing every client, until ctx ends.
func Run(ctx context.Context, addr string, log *slog.Logger) error {
	srv := mochi.New(&mochi.Options{Logger: log})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return err
	}
	if err := srv.AddListener(NewTCP(srv, "tcp", addr)); err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	<-ctx.Done()
	return srv.Close()
}

// NewTCP is mochi's TCP listener on addr, with ID id, for srv: its Close
// disconnects srv's clients of it from one copy of the clients
// (Clients.GetAll) instead of mochi's CloseFn. That one
// (Clients.GetByListener in v2.7.9) takes the clients' read lock twice, and
// a client connecting or ending in between (Add or Delete waiting for the
// write lock) deadlocks the broker's Close for good
// (mochi-mqtt/server#488, unreleased fixes): a four-copy test pass of the
// sidecar hung so. The agent's own listener does the same
// (agent/listener.go).
func NewTCP(srv *mochi.Server, id, addr string) listeners.Listener {
	return &tcp{TCP: listeners.NewTCP(listeners.Config{ID: id, Address: addr}), srv: srv}
}

type tcp struct {
	*listeners.TCP
	srv *mochi.Server
}

func (l *tcp) Close(listeners.CloseFn) {
	l.TCP.Close(func(id string) {
		for _, cl := range l.srv.Clients.GetAll() {
			if cl.Net.Listener == id && !cl.Closed() {
				_ = l.srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
			}
		}
	})
}
