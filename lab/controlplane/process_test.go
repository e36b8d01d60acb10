package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestExitErrorSaysWhichExitsStartRetries(t *testing.T) {
	for _, c := range []struct {
		name, component, log string
		portTaken, kwokRace  bool
	}{
		{"a taken port", "kube-apiserver", "E1202 failed to listen: listen tcp 127.0.0.1:6443: bind: address already in use\n", true, false},
		{"kwok's start-up map race", "kwok", "{\"msg\":\"Creating lease\"}\nfatal error: concurrent map writes\n\ngoroutine 45 [running]:\n", false, true},
		{"kwok's read-write map race", "kwok", "fatal error: concurrent map read and map write\n", false, true},
		{"a map race in a component of ours to fix, not retry", "kube-scheduler", "fatal error: concurrent map writes\n", false, false},
		{"kwok's other crashes", "kwok", "panic: runtime error: invalid memory address or nil pointer dereference\n", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), c.component+".log")
			if err := os.WriteFile(logPath, []byte(c.log), 0o644); err != nil {
				t.Fatal(err)
			}
			p := &process{name: c.component, logPath: logPath, err: errors.New("exit status 2")}
			err := p.exitError()
			if got := errors.Is(err, errPortTaken); got != c.portTaken {
				t.Errorf("errors.Is(%v, errPortTaken) = %v, want %v", err, got, c.portTaken)
			}
			if got := errors.Is(err, errKwokRace); got != c.kwokRace {
				t.Errorf("errors.Is(%v, errKwokRace) = %v, want %v", err, got, c.kwokRace)
			}
		})
	}
}
