package scrape_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/amf-edge/amf/lab/scrape"
)

// A real registry served by promhttp, as the agent serves its /metrics.
func TestFamiliesReadsWhatARegistryServes(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "amf_test_pods", Help: "pods"}, []string{"state"})
	g.WithLabelValues("healthy").Set(3)
	reg.MustRegister(g, collectors.NewGoCollector())
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	fams, err := scrape.Families(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if v := fams["amf_test_pods"].GetMetric()[0].GetGauge().GetValue(); v != 3 {
		t.Errorf("amf_test_pods = %v, want 3", v)
	}
	if n := fams["go_goroutines"].GetMetric()[0].GetGauge().GetValue(); n < 1 {
		t.Errorf("go_goroutines = %v", n)
	}
}

func TestFamiliesSaysWhatAnEndpointAnswered(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		h          http.HandlerFunc
	}{
		{"not found", "404", func(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) }},
		{"not Prometheus text", "", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>{{{\n")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.h)
			defer srv.Close()
			_, err := scrape.Families(context.Background(), srv.URL)
			if err == nil || !strings.Contains(err.Error(), srv.URL) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want the URL and %q", err, tc.want)
			}
		})
	}
}
