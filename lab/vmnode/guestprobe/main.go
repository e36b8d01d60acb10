// Command guestprobe runs inside lab/vmnode's guest node and lets the host's
// tests look in: it serves the guest's files (/file?path=), globs
// (/glob?pattern=) and the output of a program on the run's disk
// (/run?prog=/amf/...&arg=...), and GETs a pod's loopback-only endpoints
// from inside its network namespace (/get?pid=&url=), and kills a process
// with SIGKILL, saying when by the guest's clock (/kill?pid=), over HTTP on the guest's port 7070, which
// qemu forwards from the host's loopback only. Test infrastructure.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	listen := flag.String("listen", ":7070", "address to serve on")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /file", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Write(b)
	})
	mux.HandleFunc("GET /glob", func(w http.ResponseWriter, r *http.Request) {
		m, err := filepath.Glob(r.URL.Query().Get("pattern"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, strings.Join(m, "\n"))
	})
	mux.HandleFunc("GET /run", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		prog := q.Get("prog")
		// Programs of the run's disk and the guest's own diagnostics only.
		allowed := strings.HasPrefix(filepath.Clean(prog), "/amf/") ||
			map[string]bool{"/usr/sbin/iptables-save": true, "/usr/bin/journalctl": true, "/usr/bin/systemctl": true, "/usr/sbin/ip": true, "/usr/bin/ps": true}[prog]
		if !allowed {
			http.Error(w, "not a program this probe runs: "+prog, http.StatusForbidden)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, prog, q["arg"]...).CombinedOutput()
		if err != nil {
			w.Header().Set("X-Exit", err.Error())
		}
		w.Write(out)
	})
	mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		b, err := getIn(r.Context(), "/proc/"+q.Get("pid")+"/ns/net", q.Get("url"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Write(b)
	})
	mux.HandleFunc("GET /kill", func(w http.ResponseWriter, r *http.Request) {
		pid, err := strconv.Atoi(r.URL.Query().Get("pid"))
		if err != nil || pid <= 1 {
			http.Error(w, "kill: pid must be a process of the guest's other than init", http.StatusBadRequest)
			return
		}
		// The guest's clock just before the signal: the moment a test
		// measures the agent's view of the kill from, on the same clock.
		at := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		fmt.Fprint(w, at.Format(time.RFC3339Nano))
	})
	log.Fatal(http.ListenAndServe(*listen, mux))
}

// getIn GETs url from inside the network namespace netns (a pod's: its
// loopback-only endpoints), dialling from an OS thread moved into it.
func getIn(ctx context.Context, netns, url string) ([]byte, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			// The thread is never handed back: it ends with the goroutine.
			runtime.LockOSThread()
			f, err := os.Open(netns)
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{err: fmt.Errorf("setns %s: %w", netns, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
