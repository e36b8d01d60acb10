package clusterfake

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

var leasesResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

// leaseEvent is one change of a Lease, at the resourceVersion it got.
type leaseEvent struct {
	rv  int
	typ watch.EventType
	l   *coordinationv1.Lease
}

// Lease gets Lease ns/name.
func (f *Cluster) Lease(_ context.Context, ns, name string) (*coordinationv1.Lease, error) {
	f.Lock()
	defer f.Unlock()
	if err := f.Fail["lease"]; err != nil {
		return nil, err
	}
	if l, ok := f.Leases[Key{ns, name}]; ok {
		return l.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(leasesResource, name)
}

// CreateLease creates l; AlreadyExists if its name is taken.
func (f *Cluster) CreateLease(_ context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	f.Lock()
	defer f.Unlock()
	if err := f.Fail["lease"]; err != nil {
		return nil, err
	}
	if _, ok := f.Leases[Key{l.Namespace, l.Name}]; ok {
		return nil, apierrors.NewAlreadyExists(leasesResource, l.Name)
	}
	f.Writes = append(f.Writes, fmt.Sprintf("lease create %s/%s", l.Namespace, l.Name))
	return f.putLeaseLocked(watch.Added, l.DeepCopy()), nil
}

// UpdateLease replaces l; NotFound if it is gone, Conflict if it changed
// since l's resourceVersion (an update without one is unconditional, as
// the API server allows for Leases).
func (f *Cluster) UpdateLease(_ context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	f.Lock()
	defer f.Unlock()
	if err := f.Fail["lease"]; err != nil {
		return nil, err
	}
	have, ok := f.Leases[Key{l.Namespace, l.Name}]
	switch {
	case !ok:
		return nil, apierrors.NewNotFound(leasesResource, l.Name)
	case l.ResourceVersion != "" && l.ResourceVersion != have.ResourceVersion:
		return nil, apierrors.NewConflict(leasesResource, l.Name, fmt.Errorf("resourceVersion %s, the object is at %s", l.ResourceVersion, have.ResourceVersion))
	}
	f.Writes = append(f.Writes, fmt.Sprintf("lease update %s/%s", l.Namespace, l.Name))
	return f.putLeaseLocked(watch.Modified, l.DeepCopy()), nil
}

// putLeaseLocked stores l at a new resourceVersion, logs the change for
// watches and sends it to those open, and returns a copy.
func (f *Cluster) putLeaseLocked(typ watch.EventType, l *coordinationv1.Lease) *coordinationv1.Lease {
	l.ResourceVersion = f.nextRV()
	f.Leases[Key{l.Namespace, l.Name}] = l
	ev := leaseEvent{rv: f.rv, typ: typ, l: l.DeepCopy()}
	f.leaseLog = append(f.leaseLog, ev)
	for _, w := range slices.Clone(f.leaseWs) {
		w.sendLocked(ev)
	}
	f.ChangedLocked(nil)
	return l.DeepCopy()
}

// LeaseListWatch lists and watches the Leases of namespace ns that match
// the label selector. A watch from a resourceVersion (an informer's, after
// its list) replays every change since; one from "" or "0" starts with the
// Leases as they are, as ADDED events.
func (f *Cluster) LeaseListWatch(ns, selector string) cache.ListerWatcher {
	return &leaseListWatch{f: f, ns: ns, selector: selector}
}

// leaseListWatch is a cache.ListerWatcher (with contexts) on the fake.
type leaseListWatch struct {
	f            *Cluster
	ns, selector string
}

// IsWatchListSemanticsUnSupported tells the reflector to list, then watch:
// the fake does not stream a list's initial events (WatchListClient).
func (*leaseListWatch) IsWatchListSemanticsUnSupported() bool { return true }

func (lw *leaseListWatch) matcher(o metav1.ListOptions) (labels.Selector, error) {
	sel := lw.selector
	if o.LabelSelector != "" {
		sel = o.LabelSelector // ListOptions of the caller win, as with the real one's tweak
	}
	s, err := labels.Parse(sel)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("label selector %q: %v", sel, err))
	}
	return s, nil
}

func (lw *leaseListWatch) matches(s labels.Selector, l *coordinationv1.Lease) bool {
	return (lw.ns == "" || l.Namespace == lw.ns) && s.Matches(labels.Set(l.Labels))
}

func (lw *leaseListWatch) List(o metav1.ListOptions) (runtime.Object, error) {
	return lw.ListWithContext(context.Background(), o)
}

func (lw *leaseListWatch) ListWithContext(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
	s, err := lw.matcher(o)
	if err != nil {
		return nil, err
	}
	f := lw.f
	f.Lock()
	defer f.Unlock()
	if err := f.Fail["lease"]; err != nil {
		return nil, err
	}
	list := &coordinationv1.LeaseList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(f.rv)}}
	for _, l := range f.Leases {
		if lw.matches(s, l) {
			list.Items = append(list.Items, *l.DeepCopy())
		}
	}
	slices.SortFunc(list.Items, func(a, b coordinationv1.Lease) int { return cmpKey(a.ObjectMeta, b.ObjectMeta) })
	return list, nil
}

func cmpKey(a, b metav1.ObjectMeta) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

func (lw *leaseListWatch) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return lw.WatchWithContext(context.Background(), o)
}

func (lw *leaseListWatch) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	s, err := lw.matcher(o)
	if err != nil {
		return nil, err
	}
	from := 0
	if o.ResourceVersion != "" && o.ResourceVersion != "0" {
		if from, err = strconv.Atoi(o.ResourceVersion); err != nil {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("resourceVersion %q: %v", o.ResourceVersion, err))
		}
	}
	f := lw.f
	f.Lock()
	defer f.Unlock()
	if err := f.Fail["lease"]; err != nil {
		return nil, err
	}
	if from > f.rv {
		return nil, apierrors.NewTimeoutError(fmt.Sprintf("resourceVersion %d is ahead of the fake's %d", from, f.rv), 1)
	}
	w := &leaseWatch{f: f, lw: lw, sel: s, ch: make(chan watch.Event, 1024)}
	if from == 0 { // the current state first, as the API server does
		for _, k := range sortedKeys(f.Leases) {
			if l := f.Leases[k]; lw.matches(s, l) {
				w.ch <- watch.Event{Type: watch.Added, Object: l.DeepCopy()}
			}
		}
	} else {
		for _, ev := range f.leaseLog {
			if ev.rv > from {
				w.sendLocked(ev)
			}
		}
	}
	if !w.stopped {
		f.leaseWs = append(f.leaseWs, w)
	}
	if ctx.Done() != nil {
		go func() { <-ctx.Done(); w.Stop() }() // a watch ends with its request's context
	}
	return w, nil
}

func sortedKeys(m map[Key]*coordinationv1.Lease) []Key {
	keys := make([]Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		return cmpKey(metav1.ObjectMeta{Namespace: a.Namespace, Name: a.Name}, metav1.ObjectMeta{Namespace: b.Namespace, Name: b.Name})
	})
	return keys
}

// leaseWatch is one open watch of Leases; its state is under the fake's
// lock.
type leaseWatch struct {
	f       *Cluster
	lw      *leaseListWatch
	sel     labels.Selector
	ch      chan watch.Event
	stopped bool
}

// sendLocked sends ev if it is the watch's; a watch too far behind is ended,
// as the API server ends a slow watcher's (its informer lists again).
func (w *leaseWatch) sendLocked(ev leaseEvent) {
	if w.stopped || !w.lw.matches(w.sel, ev.l) {
		return
	}
	select {
	case w.ch <- watch.Event{Type: ev.typ, Object: ev.l.DeepCopy()}:
	default:
		w.stopLocked()
	}
}

func (w *leaseWatch) ResultChan() <-chan watch.Event { return w.ch }

func (w *leaseWatch) Stop() {
	w.f.Lock()
	defer w.f.Unlock()
	w.stopLocked()
}

func (w *leaseWatch) stopLocked() {
	if w.stopped {
		return
	}
	w.stopped = true
	close(w.ch)
	if i := slices.Index(w.f.leaseWs, w); i >= 0 {
		w.f.leaseWs = slices.Delete(w.f.leaseWs, i, i+1)
	}
}
