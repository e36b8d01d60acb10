package kubenode

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// inNetns runs f on a thread that is in the network namespace at nsPath, then
// moves the thread back. A socket made in f belongs to that namespace for its
// whole life, whichever thread uses it later. If the thread cannot be moved
// back it stays locked, so the runtime retires it with its goroutine instead of
// running other goroutines in the wrong namespace.
func inNetns(nsPath string, f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("network namespace of this thread: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("network namespace %s: %w", nsPath, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace %s: %w", nsPath, err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("leave network namespace %s: %w (thread retired)", nsPath, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// ListenIn listens on a TCP address inside the network namespace at nsPath.
func ListenIn(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetns(nsPath, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// DialIn dials a TCP address from inside the network namespace at nsPath (for
// example a pod's 127.0.0.1). The whole dial runs on the locked thread: a
// locked goroutine that blocks keeps its thread, so the socket is made there.
func DialIn(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(nsPath, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}
