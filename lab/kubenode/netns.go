package kubenode

import (
	"context"
	"net"

	"github.com/amf-edge/amf/netns"
)

// ListenIn listens on a TCP address inside the network namespace at nsPath.
func ListenIn(nsPath, addr string) (net.Listener, error) { return netns.Listen(nsPath, addr) }

// DialIn dials a TCP address from inside the network namespace at nsPath (for
// example a pod's 127.0.0.1).
func DialIn(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	return netns.Dial(ctx, nsPath, addr)
}
