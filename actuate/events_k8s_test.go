package actuate_test

import (
	"context"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// TestRepeatedWarningIsOneEventSeries: a Deployment with an invalid policy
// whose pod signals n times gets one InvalidPolicy Warning Event object whose
// series counts the n signals (the count is written at the first repeat, then
// at most every 10 s, and when the actuator stops), not n objects.
func TestRepeatedWarningIsOneEventSeries(t *testing.T) {
	t.Parallel()
	ctx, _, admin := startCluster(t, 90*time.Second)
	agentClient := agentClientset(ctx, t, admin, actuate.Rules())
	mustCreate(t, func() error {
		return createDeployment(ctx, admin, "broker-c", 1, map[string]string{contract.AnnStandby: "broker-d", contract.AnnRedundancy: "warm"})
	})
	pod := onlyPod(ctx, t, admin, "broker-c")
	send, done := runActuator(ctx, t, agentClient, admin.ns, false)
	defer done()
	const n, more = 20, 5
	for range n {
		send(pod, podsignal.Anomalous)
	}
	ev := waitEventWith(ctx, t, admin, "broker-c", "InvalidPolicy", "with a series", func(e *eventsv1.Event) bool {
		return e.Type == "Warning" && e.Series != nil && e.Series.Count >= 2
	})
	ev = waitEventWith(ctx, t, admin, "broker-c", "InvalidPolicy", "counting every signal", func(e *eventsv1.Event) bool {
		return e.Name == ev.Name && e.Series != nil && e.Series.Count == n
	})
	t.Logf("series after %d signals: count %d, first %s, last observed %s", n, ev.Series.Count,
		ev.EventTime.Format(time.RFC3339Nano), ev.Series.LastObservedTime.Format(time.RFC3339Nano))
	for range more {
		send(pod, podsignal.Anomalous)
	}
	// Run takes a signal only once it has handled the one before, so this
	// one, about a pod that does not exist, returns after the last repeat was
	// queued for the recorder (a signal still being handled when the actuator
	// stops may be dropped, which is not what this test is about).
	send("no-such-pod", podsignal.Healthy)
	done() // the count not written yet is written as the actuator stops
	countInvalid := func() (int, int32) {
		list, err := admin.EventsV1().Events(admin.ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		objects, count := 0, int32(0)
		for _, e := range list.Items {
			if e.Regarding.Name == "broker-c" && e.Reason == "InvalidPolicy" {
				objects++
				if e.Series != nil {
					count = e.Series.Count
				}
			}
		}
		return objects, count
	}
	if objects, count := countInvalid(); objects != 1 || count != n+more {
		t.Errorf("%d signals gave %d InvalidPolicy Event objects, series count %d; want 1 object counting %d", n+more, objects, count, n+more)
	}
}
