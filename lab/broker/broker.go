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
)

// Run serves MQTT on addr, allowing every client, until ctx ends.
func Run(ctx context.Context, addr string, log *slog.Logger) error {
	srv := mochi.New(&mochi.Options{Logger: log})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return err
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})); err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	<-ctx.Done()
	return srv.Close()
}
