package handover

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/mosquittodb"
	"github.com/amf-edge/amf/pause"
)

// broker is a real Mosquitto in a real cgroup of its own, which the test can
// restart as a kubelet restarts a container whose process died.
type broker struct {
	*brokerstate.Mosquitto
	t      *testing.T
	cgroup string // cgroup.procs of the container's cgroup
	leaf   string
}

func skipUnlessReal(t *testing.T) string {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("AMF_REQUIRE_REAL_CGROUPS") == "1" {
			t.Fatalf("AMF_REQUIRE_REAL_CGROUPS=1, but: %s", why)
		}
		t.Skip("skip: " + why)
	}
	if testing.Short() {
		t.Skip("starts real Mosquitto brokers")
	}
	if os.Geteuid() != 0 {
		skip("real cgroups need root")
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "mosquitto"} {
		if bin, err := exec.LookPath(p); err == nil {
			return bin
		}
	}
	skip("mosquitto not installed (make deps)")
	return ""
}

// containerCgroup makes a cgroup for one broker (cpuacct on v1, the unified
// tree on v2) and removes it at the end.
func containerCgroup(t *testing.T) (procs, leaf string) {
	t.Helper()
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	leaf = "amf-test-handover-" + hex.EncodeToString(rnd[:])
	root := "/sys/fs/cgroup"
	if _, err := os.Stat("/sys/fs/cgroup/cpuacct"); err == nil {
		root = "/sys/fs/cgroup/cpuacct"
	}
	dir := filepath.Join(root, leaf)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
			t.Errorf("remove cgroup %s: %v", dir, err)
		}
	})
	return filepath.Join(dir, "cgroup.procs"), leaf
}

func newBroker(t *testing.T, bin string, persistence bool) *broker {
	t.Helper()
	b := &broker{t: t}
	b.cgroup, b.leaf = containerCgroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := brokerstate.StartMosquitto(ctx, bin, t.TempDir(), persistence)
	if err != nil {
		t.Fatal(err)
	}
	b.Mosquitto = m
	t.Cleanup(m.Kill) // before the cgroup's removal, which runs later
	b.join()
	return b
}

// join moves the broker's process into its container cgroup.
func (b *broker) join() {
	b.t.Helper()
	if err := os.WriteFile(b.cgroup, []byte(strconv.Itoa(b.PID())), 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// restart starts the broker again, as its kubelet does.
func (b *broker) restart(ctx context.Context) {
	b.t.Helper()
	if err := b.Start(ctx); err != nil {
		b.t.Fatal(err)
	}
	b.join()
}

func (b *broker) handover() Broker {
	return Broker{Container: pause.Container{Leaf: b.leaf}, File: b.File}
}

func mosquittoSub(t *testing.T) string {
	t.Helper()
	p, err := brokerstate.MosquittoSub()
	if err != nil {
		if os.Getenv("AMF_REQUIRE_REAL_CGROUPS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return p
}

// TestFinalStateRestartsAnotherBrokerWithEverythingItHeld is the planned
// switchover's handover on real brokers and real clients: the primary holds
// retained messages, 3.1.1 and MQTT 5 persistent sessions and QoS 1
// messages queued for them; it is stopped as its kubelet stops it, its final
// file installed in the standby, which is restarted on it; every retained
// message, session (session present 1, its subscription in place without a
// new SUBSCRIBE) and queued message is there, none twice. Before the
// install the standby holds none of it, so the check can fail.
func TestFinalStateRestartsAnotherBrokerWithEverythingItHeld(t *testing.T) {
	bin := skipUnlessReal(t)
	plan := brokerstate.Plan{Retained: 200, Sessions: 2, V5Sessions: 1, Queued: 10, MosquittoSub: mosquittoSub(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, standby := newBroker(t, bin, true), newBroker(t, bin, true)
	if err := brokerstate.Seed(ctx, primary.Addr, plan); err != nil {
		t.Fatal(err)
	}

	snap, err := primary.handover().Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := func(s mosquittodb.Summary, shutdown bool) {
		t.Helper()
		for _, id := range plan.SessionIDs() {
			if !slices.Contains(s.Sessions, id) {
				t.Errorf("state lacks session %s: %v", id, s.Sessions)
			}
		}
		if s.Retained != plan.Retained || s.Queued != 3*plan.Queued || s.Shutdown != shutdown {
			t.Errorf("state holds %d retained, %d queued, shutdown %v; want %d, %d, %v", s.Retained, s.Queued, s.Shutdown, plan.Retained, 3*plan.Queued, shutdown)
		}
	}
	want(snap.Summary, false)

	final, err := primary.handover().Final(ctx, func() { _ = primary.Signal(syscall.SIGTERM) })
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.WaitExit(ctx); err != nil {
		t.Fatalf("the primary's broker did not end cleanly on SIGTERM: %v", err)
	}
	want(final.Summary, true)

	before, err := brokerstate.Check(ctx, standby.Addr, plan)
	if err != nil {
		t.Fatal(err)
	}
	if before.RetainedFound != 0 || len(before.SessionsLost) != len(plan.SessionIDs()) {
		t.Fatalf("the standby held state before the handover: %v", before)
	}

	sum, err := standby.handover().Install(final.Data)
	if err != nil {
		t.Fatal(err)
	}
	want(sum, true)
	if err := standby.WaitExit(ctx); err == nil {
		t.Fatal("the standby's broker ended cleanly; Install must kill it (a stopping Mosquitto saves over the file)")
	}
	standby.restart(ctx)

	after, err := brokerstate.Check(ctx, standby.Addr, plan)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Lossless() || after.Duplicates != 0 || after.RetainedFound != plan.Retained || after.QueuedFound != 3*plan.Queued {
		t.Errorf("after the handover: %v; want all %d retained, %d queued, no session lost, no duplicate", after, plan.Retained, 3*plan.Queued)
	}
}

// TestInstallRefusesAForeignOrTornFileAndChangesNothing: the broker keeps
// running on its own state, its file as it was.
func TestInstallRefusesAForeignOrTornFileAndChangesNothing(t *testing.T) {
	bin := skipUnlessReal(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newBroker(t, bin, true)
	if err := brokerstate.Seed(ctx, b.Addr, brokerstate.Plan{Retained: 3}); err != nil {
		t.Fatal(err)
	}
	own, err := b.handover().Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"torn":    own.Data[:len(own.Data)-3],
		"foreign": []byte("SQLite format 3\x00 and more bytes than a header"),
		"empty":   nil,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := b.handover().Install(data)
			if !errors.Is(err, mosquittodb.ErrFormat) {
				t.Fatalf("Install = %v, want a refusal wrapping mosquittodb.ErrFormat", err)
			}
			if got, _ := os.ReadFile(b.File); !bytes.Equal(got, own.Data) {
				t.Error("the broker's file changed")
			}
			select {
			case <-b.Exited():
				t.Fatalf("the broker ended: %v", b.Err())
			default:
			}
			if res, err := brokerstate.Check(ctx, b.Addr, brokerstate.Plan{Retained: 3}); err != nil || res.RetainedFound != 3 {
				t.Errorf("the broker no longer serves its state: %v, %v", res, err)
			}
		})
	}
}

// TestSnapshotOfABrokerWithoutPersistenceSaysSo: Mosquitto ignores SIGUSR1
// without persistence; the wait ends with ctx and says what to check.
func TestSnapshotOfABrokerWithoutPersistenceSaysSo(t *testing.T) {
	bin := skipUnlessReal(t)
	b := newBroker(t, bin, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := b.handover().Snapshot(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !bytes.Contains([]byte(err.Error()), []byte("is persistence on")) {
		t.Fatalf("Snapshot = %v, want the deadline and a hint about persistence", err)
	}
	select {
	case <-b.Exited():
		t.Fatalf("SIGUSR1 ended the broker: %v", b.Err())
	default:
	}
}

// TestOnlyTheBrokerIsSignalled: a shell that started the broker, in the
// same container, would die of SIGUSR1; only the processes named as the
// broker are chosen.
func TestOnlyTheBrokerIsSignalled(t *testing.T) {
	bin := skipUnlessReal(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newBroker(t, bin, true)
	sh := exec.Command("sleep", "300")
	sh.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sh.Wait() }()
	t.Cleanup(func() { _ = sh.Process.Kill(); <-done })
	if err := os.WriteFile(b.cgroup, []byte(strconv.Itoa(sh.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	all, err := b.handover().Container.PIDs()
	if err != nil || len(all) != 2 {
		t.Fatalf("the container's processes = %v, %v; want the broker and sleep", all, err)
	}
	pids, err := b.handover().pids()
	if err != nil || !slices.Equal(pids, []int{b.PID()}) {
		t.Fatalf("signalled %v (%v), want only the broker %d", pids, err, b.PID())
	}
	if _, err := b.handover().Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
}
