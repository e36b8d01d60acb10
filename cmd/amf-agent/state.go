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
	"k8s.io/client-go/kubernetes"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/agent"
	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/statehub"
)

// stateHub is --state-listen's hub: its configuration (checked by its
// Validate) and where it listens; with --state-peer-token it also takes
// the states relayed by the agents of other nodes, and relays this node's
// to theirs.
type stateHub struct {
	cfg                  statehub.Config
	addr                 string // --state-listen
	advertise, tokenFile string // --state-advertise, --state-peer-token
	account              string // of the peer token, with tokenFile
}

// configureStateHub builds the hub's configuration; a relay to it must
// come from the account of --state-peer-token, checked by TokenReview.
func configureStateHub(o *options, auth authenticator, reg prometheus.Registerer, log *slog.Logger) (*stateHub, error) {
	h := &stateHub{cfg: statehub.Config{Authenticator: auth.Authenticator, Logger: log, Registerer: reg},
		addr: o.stateListen, advertise: o.stateAdvertise, tokenFile: o.statePeerToken}
	if h.tokenFile == "" {
		return h, nil
	}
	reviews, err := kubernetes.NewForConfig(auth.kubeCfg)
	if err != nil {
		return nil, fmt.Errorf("TokenReview client: %w", err)
	}
	if h.account, err = agent.AccountOf(h.tokenFile); err != nil {
		return nil, fmt.Errorf("--state-peer-token: %w", err)
	}
	peers, err := agent.NewPeerAuthenticator(cluster.NewKube(reviews), h.account)
	if err != nil {
		return nil, err
	}
	h.cfg.Peers = peers
	return h, nil
}

// serve binds the state hub and serves it until ctx ends, and, with peers,
// relays this node's states to theirs; acfg gets the hub and, with peers,
// the relay and the advertised address. wait returns once both have
// stopped.
func (h *stateHub) serve(ctx context.Context, acfg *actuate.Config) (wait func() error, err error) {
	log := h.cfg.Logger
	if h.tokenFile != "" {
		log.Info("state hub takes relays from the agents of other nodes", slog.String("account", h.account), slog.String("advertise", h.advertise))
	}
	hub, err := statehub.New(h.cfg)
	if err != nil {
		return nil, err
	}
	acfg.States = hub
	relayDone := make(chan error, 1)
	if h.tokenFile == "" {
		relayDone <- nil
	} else {
		relay, err := statehub.NewRelay(hub, statehub.RelayConfig{TokenFile: h.tokenFile, Logger: log.With("part", "relay")})
		if err != nil {
			return nil, err
		}
		acfg.StateRelay, acfg.StateAddr = relay, "http://"+h.advertise
		go func() { relayDone <- relay.Run(ctx) }()
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", h.addr)
	if err != nil {
		return nil, fmt.Errorf("state hub: %w (give --state-listen a free address)", err)
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
	return func() error {
		err := <-done
		if err != nil {
			err = fmt.Errorf("state hub: %w", err)
		}
		return errors.Join(err, <-relayDone)
	}, nil
}
