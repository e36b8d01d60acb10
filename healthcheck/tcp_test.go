package healthcheck

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func itoa(i int) string { return strconv.Itoa(i) }

func TestTCPProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()

	p, err := NewTCPProber(TCPConfig{Address: addr, Interval: 50 * time.Millisecond, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	run := runProber(t, p)
	if r := run.await(t, true, 5*time.Second); r.RTT <= 0 {
		t.Fatalf("passing result %+v: want RTT > 0", r)
	}
	_ = ln.Close()
	r := run.await(t, false, 5*time.Second)
	if !strings.Contains(r.Reason, "connect to "+addr) {
		t.Fatalf("failure reason %q", r.Reason)
	}
}

func TestNewTCPProber(t *testing.T) {
	for _, cfg := range []TCPConfig{
		{},
		{Address: "no-port"},
		{Address: "127.0.0.1:1", Interval: time.Second, Timeout: 2 * time.Second},
	} {
		if _, err := NewTCPProber(cfg); err == nil {
			t.Errorf("accepted %+v", cfg)
		}
	}
}
