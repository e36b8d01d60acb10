package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/amf-edge/amf/agent"
	"github.com/amf-edge/amf/statehub"
)

// serveStateHub binds the state hub at addr and serves it until ctx ends;
// wait returns once it has stopped.
func serveStateHub(ctx context.Context, addr string, auth agent.Authenticator, reg prometheus.Registerer, log *slog.Logger) (*statehub.Hub, func() error, error) {
	hub, err := statehub.New(statehub.Config{Authenticator: auth, Logger: log, Registerer: reg})
	if err != nil {
		return nil, nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("state hub: %w (give --state-listen a free address)", err)
	}
	srv := &http.Server{
		Handler: hub.Handler(),
		// A state is at most 24 MiB, and a fetch a long poll of 25 s:
		// the bounds leave room for both, and none for a client that
		// holds a connection open without sending.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      90 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("state hub serving", slog.String("addr", ln.Addr().String()))
	return hub, func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("state hub: %w", err)
		}
		return nil
	}, nil
}
