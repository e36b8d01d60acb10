// Command guestprobe runs inside lab/vmnode's guest node and lets the host's
// tests look in: it serves the guest's files (/file?path=), globs
// (/glob?pattern=) and the output of a program on the run's disk
// (/run?prog=/amf/...&arg=...) over HTTP on the guest's port 7070, which
// qemu forwards from the host's loopback only. Test infrastructure.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
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
	log.Fatal(http.ListenAndServe(*listen, mux))
}
