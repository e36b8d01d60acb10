package sidecar

import (
	"bufio"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// busyEnv makes this test binary a busy child instead of running the tests:
// a process to sample that needs nothing but the binary (no shell), so that
// it also runs in the initramfs of make test-cgroup2.
const busyEnv = "AMF_SIDECAR_TEST_BUSY"

// hogEnv makes this test binary a child that waits for a line on stdin (so
// it can be moved into a cgroup first), then allocates and touches memory
// until the OOM killer ends it.
const hogEnv = "AMF_SIDECAR_TEST_HOG"

func TestMain(m *testing.M) {
	if os.Getenv(busyEnv) == "1" {
		for n := 0; ; n++ { // burn CPU until killed
			runtime.KeepAlive(n)
		}
	}
	if os.Getenv(hogEnv) == "1" {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		var keep [][]byte
		for {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = byte(i)
			}
			keep = append(keep, b)
			runtime.KeepAlive(keep)
		}
	}
	os.Exit(m.Run())
}

// selfCommand runs this test binary again, running no test: a child whose
// role the environment gives. AMF_TEST_EXEC_WRAPPER runs it under an
// emulator (make test-arm64), since an arm64 binary cannot be executed
// directly there.
func selfCommand() *exec.Cmd {
	name, args := os.Args[0], []string{"-test.run=^$"}
	if w := os.Getenv("AMF_TEST_EXEC_WRAPPER"); w != "" {
		name, args = w, append([]string{os.Args[0]}, args...)
	}
	return exec.Command(name, args...)
}

func TestSamplingARealProcess(t *testing.T) {
	// A busy child process, sampled from outside as the sidecar samples a broker.
	busy := selfCommand()
	busy.Env = append(os.Environ(), busyEnv+"=1")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	src, err := cgroup.ForPID(busy.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	s, err := detect.NewSampler(src, infer.DefaultConfig(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	var last detect.Record
	// Read until cpu_percent is defined and above zero: the child must have
	// been given CPU time since the first reading (on a loaded machine that
	// can take a while), and a wall clock stepped back restarts the windows.
	// The ticker only spaces the readings; the deadline bounds the wait.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for {
		if last, err = s.Sample(t.Context()); err != nil {
			t.Fatal(err)
		}
		if v := last.Features; v.Why[contract.CPUPercent] == infer.Defined && v.Values[contract.CPUPercent] > 0 {
			break
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("cpu_percent of a busy process still %v (%v) after 30 s", last.Features.Values[contract.CPUPercent], last.Features.Why[contract.CPUPercent])
		}
	}
	v := last.Features
	if v.Why[contract.CPUPercent] != infer.Defined || !(v.Values[contract.CPUPercent] > 0) {
		t.Fatalf("cpu_percent of a busy process = %v (%v)", v.Values[contract.CPUPercent], v.Why[contract.CPUPercent])
	}
	if !(v.Values[contract.MemoryPercent] > 0) {
		t.Fatalf("memory_percent = %v", v.Values[contract.MemoryPercent])
	}
	line, err := detect.MarshalRecord(last)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"cpu_percent":`, `"cpu_growth_rate":null`, `"undefined":{`, `"raw":{`} {
		if !strings.Contains(string(line), want) {
			t.Errorf("JSON line lacks %s: %s", want, line)
		}
	}
}
