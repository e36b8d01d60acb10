package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/bench"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/testbed"
)

// benchState is `amf-lab bench state`: what survives of a broker's state on
// a real node (lab/bench.RunState).
func benchState(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab bench state", flag.ContinueOnError)
	fs.SetOutput(stderr)
	retained := fs.Int("retained", 300, "retained topics in each broker before its event")
	sessions := fs.Int("sessions", 3, "MQTT 3.1.1 persistent sessions (paho)")
	v5 := fs.Int("v5-sessions", 1, "MQTT 5 persistent sessions (mosquitto_sub -V 5 -c -x 3600)")
	queued := fs.Int("queued", 20, "QoS 1 messages queued for each session while it is away (at least 1 with MQTT 5 sessions)")
	nodeLoss := fs.Bool("nodeloss", true, "also cut the power of a stateful primary's node: a pair across two of three more lab nodes")
	keep := fs.Bool("keep", false, "keep the run's files")
	verbose := fs.Bool("v", false, "log the node and the control plane to standard error")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if *retained < 0 || *sessions < 0 || *v5 < 0 || *queued < 0 || (*v5 > 0 && *queued < 1) || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "amf-lab bench state: counts ≥ 0, --queued ≥ 1 with MQTT 5 sessions, no arguments")
		return exitcode.Usage
	}
	if err := kubenode.Check(); err != nil {
		fmt.Fprintf(stderr, "amf-lab bench state: cannot run a lab node here: %v\n", err)
		return exitcode.Failure
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench state: %v\n", err)
		return exitcode.Failure
	}
	dir, err := os.MkdirTemp("", "amf-lab-state-")
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench state: %v\n", err)
		return exitcode.Failure
	}
	defer func() {
		if *keep {
			fmt.Fprintf(stderr, "files kept in %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	cfg := bench.StateConfig{Plan: brokerstate.Plan{Retained: *retained, Sessions: *sessions, V5Sessions: *v5, Queued: *queued},
		Repo: repo, WorkDir: dir, NodeLoss: *nodeLoss, Progress: stderr}
	if *verbose {
		cfg.Log = func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }
	} else {
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	rep, err := bench.RunState(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench state: %v\n", err)
		*keep = true
		return exitcode.Failure
	}
	bench.WriteStateReport(stdout, rep)
	return exitcode.OK
}
