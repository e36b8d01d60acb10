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

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/agent"
	"github.com/amf-edge/amf/statehub"
)

// stateHubPeers is what a hub needs to take states relayed by the agents
// of other nodes and to relay its own; zero: neither.
type stateHubPeers struct {
	advertise, tokenFile string
	reviews              agent.TokenReviewer
}

// serveStateHub binds the state hub at addr and serves it until ctx ends,
// and, with peers, relays this node's states to theirs (acfg gets the
// relay and the advertised address); wait returns once both have stopped.
func serveStateHub(ctx context.Context, addr string, auth agent.Authenticator, peers stateHubPeers, acfg *actuate.Config, reg prometheus.Registerer, log *slog.Logger) (*statehub.Hub, func() error, error) {
	cfg := statehub.Config{Authenticator: auth, Logger: log, Registerer: reg}
	if peers.tokenFile != "" {
		account, err := agent.AccountOf(peers.tokenFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--state-peer-token: %w", err)
		}
		if cfg.Peers, err = agent.NewPeerAuthenticator(peers.reviews, account); err != nil {
			return nil, nil, err
		}
		log.Info("state hub takes relays from the agents of other nodes", slog.String("account", account), slog.String("advertise", peers.advertise))
	}
	hub, err := statehub.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	relayDone := make(chan error, 1)
	if peers.tokenFile == "" {
		relayDone <- nil
	} else {
		relay, err := statehub.NewRelay(hub, statehub.RelayConfig{TokenFile: peers.tokenFile, Logger: log.With("part", "relay")})
		if err != nil {
			return nil, nil, err
		}
		acfg.StateRelay, acfg.StateAddr = relay, "http://"+peers.advertise
		go func() { relayDone <- relay.Run(ctx) }()
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
		err := <-done
		if err != nil {
			err = fmt.Errorf("state hub: %w", err)
		}
		return errors.Join(err, <-relayDone)
	}, nil
}
