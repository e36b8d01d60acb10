package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/nodeloss"
	"github.com/amf-edge/amf/lab/testbed"
)

// benchNodeLoss is `amf-lab bench node-loss`: power cuts (and partitions)
// of a hot primary's node on three lab nodes, then Kubernetes alone on the
// same lab.
func benchNodeLoss(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab bench node-loss", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cuts := fs.Int("cuts", 10, "power cuts of the primary's node")
	tol := fs.Duration("k8s-toleration", 300*time.Second, "Kubernetes alone: the broker pod's not-ready/unreachable toleration (300s: Kubernetes' default; 0: skip that run)")
	wait := fs.Duration("k8s-wait", 10*time.Minute, "Kubernetes alone: longest wait for the service path to come back")
	slow := fs.Duration("slow", 0, "after the cuts, hold the primary's node at --slow-cpu, saturated by a busy pod, this long: a slow node must not be failed over (0: skip)")
	slowCPU := fs.Float64("slow-cpu", 0.7, "the slow node's CPU quota (cores; not below the broker pod's)")
	partitions := fs.Int("partitions", 0, "after the cuts, partitions of the primary's node (it runs on): the fence, the failover and the heal measured (0: skip)")
	crashes := fs.Int("crashes", 0, "after the cuts, crashes of the primary's broker (its processes killed): the failover its node's agent makes at once, and the clients (0: skip)")
	clientWait := fs.Duration("client-wait", 2*time.Minute, "after each cut, the longest wait for the directly connected clients (a pod's, through the ClusterIP; the LAN's, through a NodePort) to be served again (negative: no clients)")
	keep := fs.Bool("keep", false, "keep the run's files")
	verbose := fs.Bool("v", false, "log the nodes and the control plane to standard error")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if err := kubenode.Check(); err != nil {
		fmt.Fprintf(stderr, "amf-lab bench node-loss: cannot run lab nodes here: %v\n", err)
		return 1
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench node-loss: %v\n", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "amf-lab-nodeloss-")
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench node-loss: %v\n", err)
		return 1
	}
	defer func() {
		if *keep {
			fmt.Fprintf(stderr, "files kept in %s\n", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	cfg := nodeloss.BenchConfig{Cuts: *cuts, Repo: repo, WorkDir: dir, K8sToleration: *tol, K8sWait: *wait,
		Slow: *slow, SlowCPU: *slowCPU, Partitions: *partitions, Crashes: *crashes, ClientWait: *clientWait, Progress: stderr}
	if *verbose {
		cfg.Log = func(f string, a ...any) { fmt.Fprintf(stderr, f+"\n", a...) }
	} else {
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	rep, err := nodeloss.RunBench(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "amf-lab bench node-loss: %v\n", err)
		*keep = true
		return 1
	}
	nodeloss.PrintBench(stdout, rep)
	return 0
}
