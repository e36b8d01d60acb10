package soak

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/amf-edge/amf/contract"
)

func draw(s *Schedule, n int) []Step {
	out := make([]Step, n)
	for i := range out {
		out[i] = s.Next()
	}
	return out
}

var twoPairs = []contract.Mode{contract.ModeSidecar, contract.ModeNode}

func TestTheSameSeedGivesTheSameSchedule(t *testing.T) {
	a, b := draw(NewSchedule(7, nil, nil), 200), draw(NewSchedule(7, nil, nil), 200)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two schedules of seed 7 differ")
	}
	if reflect.DeepEqual(a, draw(NewSchedule(8, nil, nil), 200)) {
		t.Fatal("seeds 7 and 8 gave the same schedule")
	}
}

func TestAScheduleDrawsEveryKindAndOverlaps(t *testing.T) {
	seen, pairs := map[Kind]int{}, map[int]int{}
	overlaps := 0
	for _, st := range draw(NewSchedule(1, nil, twoPairs), 500) {
		seen[st.Kind]++
		pairs[st.Pair]++
		if st.With != nil {
			overlaps++
		}
	}
	for _, k := range Kinds() {
		if seen[k] == 0 {
			t.Errorf("500 steps and no %s", k)
		}
	}
	if overlaps == 0 {
		t.Error("500 steps and no overlapping fault")
	}
	if pairs[0] == 0 || pairs[1] == 0 {
		t.Errorf("500 steps over two pairs struck them %v times", pairs)
	}
}

func TestScheduledStepsKeepTheirShape(t *testing.T) {
	s := NewSchedule(3, nil, twoPairs)
	for i, st := range draw(s, 500) {
		if st.Quiet < s.QuietMin || st.Quiet > s.QuietMax {
			t.Errorf("step %d: quiet %v outside [%v, %v]", i, st.Quiet, s.QuietMin, s.QuietMax)
		}
		if st.Kind.Acts() && st.On != PrimaryNode {
			t.Errorf("step %d: %s strikes the %s's node, not the primary's", i, st.Kind, st.On)
		}
		if st.Kind == SidecarKilled && twoPairs[st.Pair] == contract.ModeNode {
			t.Errorf("step %d: %s of pair %d, which has no sidecar", i, st.Kind, st.Pair)
		}
		if st.With != nil && st.With.Pair != st.Pair {
			t.Errorf("step %d: %s within it names pair %d", i, st.With.Kind, st.With.Pair)
		}
		if (st.Kind == SlowNode) != (st.Hold > 0) {
			t.Errorf("step %d: %s with hold %v", i, st.Kind, st.Hold)
		}
		if w := st.With; w != nil {
			switch {
			case !st.Kind.Acts():
				t.Errorf("step %d: %s within %s, which takes nothing away", i, w.Kind, st.Kind)
			case w.Kind.Acts() || !slices.Contains(overlapping, w.Kind):
				t.Errorf("step %d: %s may not come within another", i, w.Kind)
			case w.On == PrimaryNode:
				t.Errorf("step %d: %s on the primary's node within %s", i, w.Kind, st.Kind)
			case st.Offset < 0 || st.Offset >= 2e9:
				t.Errorf("step %d: offset %v", i, st.Offset)
			}
		}
	}
}

func TestAScheduleOfSomeKindsDrawsOnlyThose(t *testing.T) {
	kinds, err := ParseKinds("crash, kubelet-restart,crash")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(kinds, []Kind{Crash, KubeletRestart}) {
		t.Fatalf("parsed %v", kinds)
	}
	for _, st := range draw(NewSchedule(5, kinds, nil), 300) {
		if st.Kind != Crash && st.Kind != KubeletRestart {
			t.Fatalf("drew %s", st.Kind)
		}
		if st.With != nil && st.With.Kind != KubeletRestart {
			t.Fatalf("drew %s within a crash", st.With.Kind)
		}
	}
}

func TestAScheduleWithoutASidecarNeverKillsOne(t *testing.T) {
	for _, st := range draw(NewSchedule(9, nil, []contract.Mode{contract.ModeNode}), 300) {
		if st.Kind == SidecarKilled {
			t.Fatal("drew sidecar-killed for a run whose only pair has no sidecar")
		}
	}
}

func TestParseKindsRefusesAnUnknownFault(t *testing.T) {
	_, err := ParseKinds("crash,meteor")
	if err == nil || !strings.Contains(err.Error(), `"meteor"`) || !strings.Contains(err.Error(), "power-cut") {
		t.Fatalf("err = %v, want the unknown fault named and the known ones listed", err)
	}
}
