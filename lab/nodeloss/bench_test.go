package nodeloss

import (
	"testing"
	"time"
)

// TestClientFiguresCountAClientNeverServedAsTheWait: the clients' p50, p99
// and max over every cut, and by kind; a client not served again within
// the wait counts as the wait, and is counted.
func TestClientFiguresCountAClientNeverServedAsTheWait(t *testing.T) {
	r := &BenchReport{PerCut: []Cut{
		{Clients: []ClientCut{{Kind: InPod, ServedS: 3}, {Kind: NodePort, ServedS: 3.5}}},
		{Clients: []ClientCut{{Kind: InPod, ServedS: 2.5}, {Kind: NodePort, ServedS: -1}}},
	}}
	r.clientFigures(2 * time.Minute)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"p50", r.ClientSOTP50, 3}, {"p99", r.ClientSOTP99, 120}, {"max", r.ClientSOTMax, 120},
		{"pod p50", r.ClientPodSOTP50, 2.5}, {"pod max", r.ClientPodSOTMax, 3},
		{"nodeport p50", r.ClientNodePortSOTP50, 3.5}, {"nodeport max", r.ClientNodePortSOTMax, 120},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if r.ClientsNotBack != 1 {
		t.Errorf("clients not back %d, want 1", r.ClientsNotBack)
	}
}

// TestNoClientsNoFigures: a bench run without clients reports none.
func TestNoClientsNoFigures(t *testing.T) {
	r := &BenchReport{PerCut: []Cut{{}}}
	r.clientFigures(time.Minute)
	if r.ClientSOTMax != 0 || r.ClientsNotBack != 0 {
		t.Errorf("figures %+v without clients", r)
	}
}
