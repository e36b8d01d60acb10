package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/inject"
)

// Recorded trees of package cgroup (see its testdata/README.md): kind's
// layout, a pod with pause, sidecar, broker and exporter.
var kindTree = filepath.Join("..", "..", "cgroup", "testdata", "v2-kind")

const (
	kindUID    = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"
	brokerID   = "3b0c6f1e2d4a5b6c7d8e9f00112233445566778899aabbccddeeff0011223344"
	exporterID = "e2e2e2e2112233445566778899aabbccddeeff00112233445566778899aabbcc"
)

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// runSidecar runs `amf-sidecar run args...` until the test ends and returns
// its /status URL and its stderr.
func runSidecar(t *testing.T, args ...string) (status string, stderr func() string) {
	t.Helper()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	var errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"run", "--http", addr, "--interval", "50ms"}, args...), stdio{strings.NewReader(""), &strings.Builder{}, &errb})
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("sidecar exit code %d:\n%s", code, errb.String())
		}
	})
	return "http://" + addr + "/status", errb.String
}

// awaitStatus polls /status until ok accepts it.
func awaitStatus(t *testing.T, url string, stderr func() string, ok func(healthcheck.Status) bool) healthcheck.Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last healthcheck.Status
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			last = healthcheck.Status{}
			err = json.NewDecoder(resp.Body).Decode(&last)
			resp.Body.Close()
			if err == nil && ok(last) {
				return last
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no such /status within 10 s; last %+v\nstderr:\n%s", last, stderr())
	return last
}

// A container name that matches nothing keeps the sidecar up, starting and
// saying why; once the kubelet's symlink for that name appears, it is found.
func TestRunFindsTheContainerByNameAndKeepsLooking(t *testing.T) {
	const pod, ns = "edge-broker-a-0", "mqtt"
	logs := t.TempDir()
	link := func(container, id string) {
		t.Helper()
		if err := os.Symlink("/var/log/pods/x", filepath.Join(logs, pod+"_"+ns+"_"+container+"-"+id+".log")); err != nil {
			t.Fatal(err)
		}
	}
	link("mosquitto", brokerID)
	url, stderr := runSidecar(t, "--pod-uid", kindUID, "--host-cgroup-root", kindTree, "--pod", pod, "--namespace", ns,
		"--container", "exporter", "--host-container-logs", logs)
	st := awaitStatus(t, url, stderr, func(s healthcheck.Status) bool { return s.TargetError != "" })
	if st.State != "starting" || !strings.Contains(st.TargetError, `has no container "exporter"`) || !strings.Contains(st.TargetError, "names mosquitto") ||
		!strings.Contains(st.TransitionReason, "broker container not found yet") {
		t.Errorf("status %+v: want starting, saying there is no container exporter", st)
	}
	if !strings.Contains(stderr(), `"msg":"broker container not found; looking again at every sample"`) {
		t.Errorf("log does not say the container was not found:\n%s", stderr())
	}

	link("exporter", exporterID)
	st = awaitStatus(t, url, stderr, func(s healthcheck.Status) bool { return s.Target != "" })
	if !strings.Contains(st.Target, "container exporter "+exporterID[:12]+" (by name, from "+logs) || st.TargetError != "" {
		t.Errorf("status %+v: want the exporter, found by name", st)
	}
}

func TestRunRefusesPodFlagsOutsidePodMode(t *testing.T) {
	code, _, errs := runCLI(t, "", "run", "--pid", "1", "--container", "mosquitto", "--http", "")
	wantExit(t, code, errs, exitUsage, "are for pod mode")
	code, _, errs = runCLI(t, "", "run", "--pod-uid", kindUID, "--container", "mosquitto", "--container-id", brokerID, "--http", "")
	wantExit(t, code, errs, exitUsage, "at most one of --container and --container-id")
}

// syncBuffer is a strings.Builder safe for the sidecar's goroutines to write
// while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// amf-agent inject writes the sidecar's command line: every flag it writes
// must be one of run's (the sidecar would crash-loop on an unknown one).
func TestRunAcceptsEveryFlagInjectWrites(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("..", "..", "inject", "testdata", "exporter.in.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := inject.Inject(in, inject.Options{Model: "leadtime"})
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					InitContainers []struct {
						Name string
						Args []string
					} `json:"initContainers"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	args := d.Spec.Template.Spec.InitContainers[0].Args
	if len(args) < 5 || args[0] != "run" {
		t.Fatalf("sidecar args %q: want run and its flags (--container, --host-container-logs among them)", args)
	}
	code, _, errs := runCLI(t, "", append(args, "-h")...)
	if strings.Contains(errs, "flag provided but not defined") || !strings.Contains(errs, "-host-container-logs") {
		t.Fatalf("run does not take inject's arguments %q (exit %d):\n%s", args, code, errs)
	}
}

// A broker without a memory limit (here: this test process, whose cgroup has
// none) is scored against what bounds it, and the sidecar says so in its log,
// /status and /metrics, instead of an assumed 100 MiB.
func TestRunOnAnUnlimitedProcessSaysWhatMemoryPercentIsRelativeTo(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		sources []string // acceptable memory reference sources
		bytes   float64  // 0: any above 100 MiB
	}{
		{"what bounds it", nil, []string{"parent_limit", "machine_memory"}, 0},
		{"the operator's reference", []string{"--memory-reference", "64Mi"}, []string{"flag"}, 64 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, stderr := runSidecar(t, append([]string{"--pid", strconv.Itoa(os.Getpid())}, tt.args...)...)
			st := awaitStatus(t, url, stderr, func(s healthcheck.Status) bool {
				return s.MemoryReference != nil && s.Features != nil && s.Features.MemoryPercent != nil
			})
			ref := st.MemoryReference
			if strings.Contains(stderr(), "target:") {
				t.Skipf("cannot sample this process's cgroup here: %s", stderr())
			}
			if !slices.Contains(tt.sources, ref.Source) || ref.Unit != "bytes" || ref.Why == "" ||
				(tt.bytes == 0 && ref.Value <= 100<<20) || (tt.bytes != 0 && ref.Value != tt.bytes) {
				t.Errorf("memory reference %+v, want one of %v", ref, tt.sources)
			}
			if tt.bytes == 0 && *st.Features.MemoryPercent >= 100 {
				t.Errorf("memory_percent %v of %v bytes: the reference does not bound the process", *st.Features.MemoryPercent, ref.Value)
			}
			if st.CPUReference == nil || st.CPUReference.Source != "one_core" || st.CPUReference.Value != 1 {
				t.Errorf("cpu reference %+v, want one core", st.CPUReference)
			}
			if log := stderr(); !strings.Contains(log, `"msg":"the broker container has no memory limit: memory_percent is relative to another reference"`) ||
				!strings.Contains(log, `"source":"`+ref.Source+`"`) || !strings.Contains(log, `"cpu_percent_reference":"cpu_percent is rate(CPU seconds) × 100, per core`) {
				t.Errorf("the log does not say which references it uses:\n%s", log)
			}
			resp, err := http.Get(strings.TrimSuffix(url, "/status") + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			for _, want := range []string{`amf_memory_reference_bytes{source="` + ref.Source + `"}`, `amf_cpu_reference_cores{source="one_core"} 1`} {
				if !strings.Contains(string(b), want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
		})
	}
}
