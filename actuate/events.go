package actuate

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Event series, after client-go's event broadcaster (tools/events): a
// series ends after seriesWindow without a repeat, and a repeat after that
// starts a new Event.
const (
	seriesWindow = 6 * time.Minute
	// seriesFlush is the least time between two writes of a series' count:
	// a warning repeated at every signal (1/s per pod) costs one write per
	// seriesFlush, not one per signal.
	seriesFlush = 10 * time.Second
	// maxSeries bounds the series remembered (crudely: beyond it, ended
	// ones are dropped, then all).
	maxSeries = 1024
	// eventQueue is how many occurrences wait for the recorder's goroutine
	// (beyond: dropped, and said so in the log) while the API is slow.
	eventQueue = 1024
)

// recorder creates the agent's events.k8s.io/v1 Events. An identical repeat
// (same object, type, reason, action and note) within seriesWindow of the
// previous one creates no object: it counts in the first one's series
// (count, lastObservedTime), as client-go's event broadcaster does, whose key
// it extends with the note so that distinct decisions stay distinct Events.
// The count is written at the first repeat, so the object says at once that
// it is a series, then at most every seriesFlush, and when the recorder
// stops.
//
// Like the broadcaster, it writes from a goroutine of its own (run), fed
// through a queue: an Event's round trip never holds up Run's loop, so it
// never delays a decision of any workload. The series belong to that
// goroutine (no locks).
type recorder struct {
	cluster Cluster
	log     *slog.Logger
	now     func() time.Time
	inst    string
	queue   chan occurrence
	series  map[eventKey]*eventSeries
}

// occurrence is one Event to record.
type occurrence struct {
	key eventKey
	at  time.Time
}

func newRecorder(c Cluster, log *slog.Logger, now func() time.Time, inst string) *recorder {
	return &recorder{cluster: c, log: log, now: now, inst: inst,
		queue: make(chan occurrence, eventQueue), series: make(map[eventKey]*eventSeries)}
}

type eventKey struct {
	regarding                 corev1.ObjectReference
	typ, reason, action, note string
}

type eventSeries struct {
	sent      *eventsv1.Event // as first sent: re-created from it if the object expired
	name      string          // the object's generated name
	count     int32
	last      time.Time // lastObservedTime
	written   int32     // count as last written
	writtenAt time.Time // last write (or attempt)
}

func (s *eventSeries) dirty() bool { return s.count > s.written }

// record queues one occurrence of an Event regarding the object ref for
// run; it never waits.
func (r *recorder) record(ref corev1.ObjectReference, warning bool, reason, action, note string) {
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	if len(note) > 1024 {
		note = note[:1024]
	}
	select {
	case r.queue <- occurrence{key: eventKey{regarding: ref, typ: typ, reason: reason, action: action, note: note}, at: r.now()}:
	default:
		r.log.Warn("event dropped: the API server is not keeping up", slog.String("reason", reason), slog.String("object", ref.Namespace+"/"+ref.Name))
	}
}

// run records the queued occurrences and writes the series counts until
// ctx ends, then, briefly, what is still queued and every count not
// written yet.
func (r *recorder) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := time.Hour
		if at, ok := r.next(); ok {
			wait = max(at.Sub(r.now()), 0)
		}
		timer.Reset(wait)
		select {
		case o := <-r.queue:
			r.handle(ctx, o)
		case <-timer.C:
			r.flush(ctx, false)
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			for {
				select {
				case o := <-r.queue:
					r.handle(fctx, o)
				default:
					r.flush(fctx, true)
					return
				}
			}
		}
	}
}

// handle records one occurrence: a new Event, or a repeat in a series.
func (r *recorder) handle(ctx context.Context, o occurrence) {
	k, now := o.key, o.at
	ref, typ, reason, action, note := k.regarding, k.typ, k.reason, k.action, k.note
	if s := r.series[k]; s != nil && now.Sub(s.last) < seriesWindow {
		s.count++
		s.last = now
		r.log.Debug("event repeated", slog.String("object", ref.Namespace+"/"+ref.Name), slog.String("reason", reason), slog.Int("count", int(s.count)))
		if s.count == 2 || now.Sub(s.writtenAt) >= seriesFlush {
			r.write(ctx, s)
		}
		return
	}
	r.log.Info("event", slog.String("deployment", ref.Namespace+"/"+ref.Name), slog.String("type", typ), slog.String("reason", reason), slog.String("note", note))
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{GenerateName: ref.Name + ".amf-", Namespace: ref.Namespace},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: Controller,
		ReportingInstance:   r.inst,
		Action:              action,
		Reason:              reason,
		Regarding:           ref,
		Note:                note,
		Type:                typ,
	}
	s := &eventSeries{sent: ev, count: 1, last: now, written: 1, writtenAt: now}
	name, err := r.cluster.CreateEvent(ctx, ev)
	if err != nil {
		r.log.Warn("event not created", slog.String("reason", reason), slog.String("error", err.Error()))
		return // the next occurrence tries again
	}
	s.name = name
	r.gc(now)
	r.series[k] = s
}

// write stores s's count and last time on its Event; a failure is tried
// again at the next flush, seriesFlush later (not at once: the API server
// may be down).
func (r *recorder) write(ctx context.Context, s *eventSeries) {
	s.writtenAt = r.now()
	series := &eventsv1.EventSeries{Count: s.count, LastObservedTime: metav1.NewMicroTime(s.last)}
	err := r.cluster.PatchEventSeries(ctx, s.sent.Namespace, s.name, series)
	if apierrors.IsNotFound(err) {
		// Expired (the API server keeps Events for an hour) or deleted:
		// a new object carries the series on.
		ev := s.sent.DeepCopy()
		ev.Series = series
		var name string
		if name, err = r.cluster.CreateEvent(ctx, ev); err == nil {
			s.name = name
		}
	}
	if err != nil {
		r.log.Warn("event series not written", slog.String("reason", s.sent.Reason), slog.Int("count", int(s.count)), slog.String("error", err.Error()))
		return
	}
	s.written = s.count
}

// flush writes the series whose count changed at least seriesFlush after
// their last write (all of them when all is set: Run is ending).
func (r *recorder) flush(ctx context.Context, all bool) {
	now := r.now()
	for _, s := range r.series {
		if s.dirty() && (all || now.Sub(s.writtenAt) >= seriesFlush) {
			r.write(ctx, s)
		}
	}
	r.gc(now)
}

// next returns when flush next has something to write, if ever.
func (r *recorder) next() (time.Time, bool) {
	var at time.Time
	for _, s := range r.series {
		if d := s.writtenAt.Add(seriesFlush); s.dirty() && (at.IsZero() || d.Before(at)) {
			at = d
		}
	}
	return at, !at.IsZero()
}

// gc forgets the series that ended and are written, and all of them when
// that is not enough to stay under maxSeries.
func (r *recorder) gc(now time.Time) {
	if len(r.series) < maxSeries {
		return
	}
	for k, s := range r.series {
		if !s.dirty() && now.Sub(s.last) >= seriesWindow {
			delete(r.series, k)
		}
	}
	if len(r.series) >= maxSeries {
		clear(r.series)
	}
}
