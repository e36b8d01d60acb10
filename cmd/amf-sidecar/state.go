package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/mosquittodb"
	"github.com/amf-edge/amf/sidecar/handover"
)

const stateUsage = `Usage:
  amf-sidecar state save [--file PATH] [--final] [--timeout 30s] > state.db
      write the broker's state (its persistence file) to standard output: now
      (SIGUSR1), or with --final the one it writes as it stops
  amf-sidecar state load [--file PATH] < state.db
      restart the broker on a state: checked, put in place under the paused
      broker, the broker killed for its kubelet to start it again on it

Mosquitto only, with persistence on. The sidecar must share the pod's process
namespace and run as the broker's user, with the broker's data volume mounted
at the folder of --file. What the state holds goes to standard error. The
sidecar holds a state in memory: at most 24 MiB, a larger one is refused.

Flags:
`

// runState is `amf-sidecar state save|load`: the handover's levers, for an
// operator with kubectl exec as for the agent (package sidecar/handover).
func runState(ctx context.Context, args []string, io stdio) int {
	if len(args) == 0 || (args[0] != "save" && args[0] != "load") {
		fmt.Fprint(io.err, stateUsage)
		return exitUsage
	}
	verb := args[0]
	fs := flag.NewFlagSet("amf-sidecar state "+verb, flag.ContinueOnError)
	fs.SetOutput(io.err)
	fs.Usage = func() { fmt.Fprint(io.err, stateUsage); fs.PrintDefaults() }
	file := fs.String("file", "/mosquitto/data/mosquitto.db", "the broker's persistence `file` as the sidecar sees it (persistence_location + persistence_file)")
	comm := fs.String("process", handover.DefaultComm, "the broker's process `name`: every process of that name visible here is the broker's")
	pid := fs.Int("pid", 0, "the broker's process `id`, when more than one process of its name is visible")
	final := fs.Bool("final", false, "save: wait for the state the broker writes as it stops, instead of asking for one now")
	timeout := fs.Duration("timeout", 30*time.Second, "save: how long to wait for the broker's file")
	if err := fs.Parse(args[1:]); err != nil {
		return exitcode.ForParse(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(io.err, "amf-sidecar state %s: unexpected arguments %q\n", verb, fs.Args())
		return exitUsage
	}
	b := handover.Broker{File: *file, Comm: *comm, PID: *pid}
	if verb == "load" {
		return loadState(b, io)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var (
		s   handover.State
		err error
	)
	if *final {
		s, err = b.Final(ctx, nil)
	} else {
		s, err = b.Snapshot(ctx)
	}
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar state save: %v\n", err)
		return exitFail
	}
	if _, err := io.out.Write(s.Data); err != nil {
		fmt.Fprintf(io.err, "amf-sidecar state save: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(io.err, "amf-sidecar state save: %s\n", describe(s.Summary.Bytes, s.Summary.Retained, len(s.Summary.Sessions), s.Summary.Queued, s.Summary.Shutdown))
	return exitOK
}

func loadState(b handover.Broker, io stdio) int {
	data, err := readAllLimited(io.in)
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar state load: standard input: %v\n", err)
		return exitUsage
	}
	sum, err := b.Install(data)
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar state load: %v\n", err)
		if errors.Is(err, mosquittodb.ErrFormat) {
			return exitUsage // the input is wrong; nothing was changed
		}
		return exitFail
	}
	fmt.Fprintf(io.err, "amf-sidecar state load: broker restarting on %s\n", describe(sum.Bytes, sum.Retained, len(sum.Sessions), sum.Queued, sum.Shutdown))
	return exitOK
}

func describe(bytes, retained, sessions, queued int, final bool) string {
	when := "a snapshot"
	if final {
		when = "the state written as the broker stopped"
	}
	return fmt.Sprintf("%s, %d bytes: %d retained messages, %d persistent sessions, %d messages queued or in flight to clients", when, bytes, retained, sessions, queued)
}

// readAllLimited reads a state from standard input, at most
// handover.MaxStateBytes: the sidecar holds it in memory.
func readAllLimited(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, handover.MaxStateBytes+1))
	if err == nil && len(b) > handover.MaxStateBytes {
		err = handover.ErrTooLarge
	}
	return b, err
}
