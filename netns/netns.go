// Package netns runs code in another network namespace, by path: a socket
// made there belongs to it for its whole life. The agent's connkill enters
// the pods' namespaces with it; the lab and the tests reach pods with it.
package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs f on a thread that is in the network namespace at path ("": the
// caller's, and f runs as it is), then moves the thread back. If the thread
// cannot be moved back it stays locked, so the runtime retires it with its
// goroutine instead of running other goroutines in the wrong namespace.
func Run(path string, f func() error) error {
	if path == "" {
		return f()
	}
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("network namespace of this thread: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(path)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("leave network namespace %s: %w (thread retired)", path, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Listen listens on a TCP address inside the network namespace at path.
func Listen(path, addr string) (net.Listener, error) {
	var l net.Listener
	err := Run(path, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// Dial dials a TCP address from inside the network namespace at path (for
// example a pod's 127.0.0.1). The whole dial runs on the locked thread: a
// locked goroutine that blocks keeps its thread, so the socket is made there.
func Dial(ctx context.Context, path, addr string) (net.Conn, error) {
	var c net.Conn
	err := Run(path, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}
