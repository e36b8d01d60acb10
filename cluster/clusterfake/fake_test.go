package clusterfake

import (
	"context"
	"errors"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/contract"
)

func lease(name, node string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "amf-system", Name: name, Labels: map[string]string{"amf.io/node": node}}}
}

// TestLeaseCallsAnswerAsTheAPIServerDoes: NotFound, AlreadyExists and a
// Conflict on a stale resourceVersion, as apierrors.
func TestLeaseCallsAnswerAsTheAPIServerDoes(t *testing.T) {
	ctx := context.Background()
	f := New()
	if _, err := f.Lease(ctx, "amf-system", "a"); !apierrors.IsNotFound(err) {
		t.Fatalf("get of no Lease: %v, want NotFound", err)
	}
	created, err := f.CreateLease(ctx, lease("a", "n0"))
	if err != nil || created.ResourceVersion == "" {
		t.Fatalf("create: %v, resourceVersion %q", err, created.ResourceVersion)
	}
	updated, err := f.UpdateLease(ctx, created)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		call func() error
		is   func(error) bool
	}{
		{"created twice", func() error { _, err := f.CreateLease(ctx, lease("a", "n0")); return err }, apierrors.IsAlreadyExists},
		{"updated from a stale resourceVersion", func() error { _, err := f.UpdateLease(ctx, created); return err }, apierrors.IsConflict},
		{"updated once gone", func() error { _, err := f.UpdateLease(ctx, lease("b", "n1")); return err }, apierrors.IsNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !tt.is(err) {
				t.Fatalf("error %v", err)
			}
		})
	}
	if got, _ := f.Lease(ctx, "amf-system", "a"); got.ResourceVersion != updated.ResourceVersion {
		t.Fatalf("resourceVersion %s, want the update's %s", got.ResourceVersion, updated.ResourceVersion)
	}
}

// TestLeaseListWatchFeedsAnInformerOnlyTheSelectedLeases: UntilWithSync (a
// reflector: list, then watch from the list's resourceVersion) sees the
// Leases there before and every later change of the selected ones, never
// the others.
func TestLeaseListWatchFeedsAnInformerOnlyTheSelectedLeases(t *testing.T) {
	f := New()
	f.Add(lease("before", "n0"), lease("other", "n9"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := make(chan string, 16)
	done := make(chan error, 1)
	go func() {
		_, err := watchtools.UntilWithSync(ctx, f.LeaseListWatch("amf-system", "amf.io/node in (n0,n1)"), &coordinationv1.Lease{}, nil,
			func(ev watch.Event) (bool, error) {
				l := ev.Object.(*coordinationv1.Lease)
				seen <- string(ev.Type) + " " + l.Name
				return l.Name == "after" && ev.Type == watch.Modified, nil
			})
		done <- err
	}()
	if got := <-seen; got != "ADDED before" {
		t.Fatalf("first %q, want ADDED before", got)
	}
	l, err := f.CreateLease(ctx, lease("after", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateLease(ctx, lease("unselected", "n9")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.UpdateLease(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(seen)
	var rest []string
	for s := range seen {
		rest = append(rest, s)
	}
	if want := []string{"ADDED after", "MODIFIED after"}; len(rest) != 2 || rest[0] != want[0] || rest[1] != want[1] {
		t.Fatalf("then %q, want %q", rest, want)
	}
}

// TestSwapRecordIsACompareAndSwap: the record is replaced only from the
// value it holds; otherwise cluster.ErrRecordMoved and nothing written.
func TestSwapRecordIsACompareAndSwap(t *testing.T) {
	ctx := context.Background()
	f := New()
	f.Add(&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "d"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1)}})
	for _, tt := range []struct {
		name       string
		prev, next string
		want       error
	}{
		{"the first record, from absent", "", `{"phase":"Idle"}`, nil},
		{"from a value it no longer holds", "", `{"phase":"Deciding"}`, cluster.ErrRecordMoved},
		{"from the value it holds", `{"phase":"Idle"}`, `{"phase":"WaitReady"}`, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := f.SwapRecord(ctx, "ns", "d", tt.prev, tt.next); !errors.Is(err, tt.want) {
				t.Fatalf("SwapRecord: %v, want %v", err, tt.want)
			}
		})
	}
	d, _ := f.Deployment(ctx, "ns", "d")
	if got := d.Annotations[contract.AnnRecord]; got != `{"phase":"WaitReady"}` {
		t.Fatalf("record %s", got)
	}
	if want := []string{"record ns/d Idle", "record ns/d WaitReady"}; len(f.Writes) != 2 || f.Writes[0] != want[0] || f.Writes[1] != want[1] {
		t.Fatalf("writes %q, want %q", f.Writes, want)
	}
	if err := f.SwapRecord(ctx, "ns", "gone", "", "x"); !apierrors.IsNotFound(err) {
		t.Fatalf("SwapRecord of no Deployment: %v, want NotFound", err)
	}
}
