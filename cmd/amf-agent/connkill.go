package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/amf-edge/amf/connkill"
	"github.com/amf-edge/amf/internal/exitcode"
)

const connkillUsage = `Usage: amf-agent connkill --socket PATH [--uid 65532] [--host-netns PATH] [--netns-dir /var/run/netns]

Serves the agent's requests to end, at once, the TCP connections this node
holds to a broker pod that is gone (package connkill): the flows its conntrack
answers from the dead endpoints, their client sockets in the pods' network
namespaces destroyed, the NAT's entries deleted. It needs CAP_NET_ADMIN and
CAP_SYS_ADMIN, the node's network namespace (hostNetwork, or --host-netns) and
the pods' namespace files (--netns-dir), which is why it is a process of its
own: the agent holds no capability and asks it on the socket, which answers
only the user --uid.

Flags:
`

// runConnkill is the connkill subcommand.
func runConnkill(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("amf-agent connkill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, connkillUsage)
		fs.PrintDefaults()
	}
	socket := fs.String("socket", "", "Unix socket `path` to serve on (its folder shared with the agent's container)")
	uid := fs.Int("uid", 65532, "the only `user` whose requests are answered: the agent's")
	hostNetns := fs.String("host-netns", "", "`path` of the node's network namespace, where its conntrack is; empty: this process's (hostNetwork)")
	netnsDir := fs.String("netns-dir", connkill.NetnsDir, "`folder` of the pods' network namespace files (containerd's CNI keeps them there)")
	if err := fs.Parse(args); err != nil {
		return parseErr(err)
	}
	if fs.NArg() > 0 {
		return exitcode.Usagef("connkill: unexpected arguments %q", fs.Args())
	}
	if *socket == "" {
		return exitcode.Usagef("connkill: --socket is required")
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A socket left by a run before (a killed container) would refuse the bind.
	if err := os.Remove(*socket); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("connkill: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: *socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("connkill: %w", err)
	}
	// The peer's user is checked on each request; the mode lets it connect.
	if err := os.Chmod(*socket, 0o666); err != nil {
		return fmt.Errorf("connkill: %w", err)
	}
	log.Info("connkill serving", slog.String("socket", *socket), slog.Int("uid", *uid), slog.String("netns_dir", *netnsDir))
	k := connkill.Killer{HostNetns: *hostNetns, Namespaces: func() ([]string, error) { return connkill.ListNetns(*netnsDir) }}
	return connkill.Serve(ctx, ln, k, *uid, log)
}
