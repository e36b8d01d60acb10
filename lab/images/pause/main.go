// Command pause is the lab's pod sandbox process, in the image
// amf.lab/pause:v1: it holds the pod's namespaces open by doing nothing until
// SIGTERM or SIGINT, then exits 0. With shareProcessNamespace it is PID 1 of
// the pod, so the kernel hands it every orphaned process of every container:
// it reaps them, or they would stay zombies until the pod is deleted.
//
// It does what Kubernetes' pause.c does, in Go so that the lab builds it
// with the rest of the project.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	reap() // children that exited before Notify took effect
	for s := range sigs {
		if s == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: shutting down, got signal: %v\n", s)
		os.Exit(0)
	}
}

// reap waits for every child that has exited. SIGCHLDs coalesce, so one
// signal may stand for many children: wait until none is left.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
	}
}
