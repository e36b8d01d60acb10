package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/amf-edge/amf/lab/proc"
)

// MosquittoPath is where Debian's mosquitto package installs the broker.
const MosquittoPath = "/usr/sbin/mosquitto"

// Broker is a Mosquitto process on loopback.
type Broker struct {
	Name string
	Addr string // 127.0.0.1:port
	Proc *proc.Proc
}

// URL is the broker's MQTT URL for paho.
func (b *Broker) URL() string { return "tcp://" + b.Addr }

// Stop ends the broker.
func (b *Broker) Stop() { b.Proc.Stop(5 * time.Second) }

// StartMosquitto starts a plain Mosquitto broker (anonymous, no persistence) on a
// free loopback port; its configuration and log are <dir>/<name>.conf and .log.
func StartMosquitto(ctx context.Context, dir, name, bin string) (*Broker, error) {
	return StartMosquittoAt(ctx, dir, name, bin, Site{})
}

// Site is where a broker runs: a network namespace (its path, e.g. a lab
// node's /proc/<pid>/ns/net) and an address in it that the host reaches.
// The zero Site is the host's loopback.
type Site struct {
	NetNS string
	IP    string
}

// StartMosquittoAt is StartMosquitto at a site: the paper's RDS and OBU are
// other clusters, so on a real node they run in the node's network namespace,
// where the edge broker's pod and the host both reach them.
func StartMosquittoAt(ctx context.Context, dir, name, bin string, site Site) (*Broker, error) {
	if bin == "" {
		bin = MosquittoPath
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("mosquitto not found at %s (%w): install it with apt-get install mosquitto (make deps)", bin, err)
	}
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	if site.IP != "" { // a port free on loopback here is as good a guess there
		_, port, _ := strings.Cut(addr, ":")
		addr = site.IP + ":" + port
	}
	conf := filepath.Join(dir, name+".conf")
	if err := os.WriteFile(conf, []byte(listener(addr)+"allow_anonymous true\npersistence false\nlog_dest stdout\nconnection_messages true\n"+proc.MosquittoStaysUser()), 0o644); err != nil {
		return nil, err
	}
	argv := []string{bin, "-c", conf}
	if site.NetNS != "" {
		argv = append([]string{"nsenter", "--net=" + site.NetNS, "--"}, argv...)
	}
	p, err := proc.Start(name, filepath.Join(dir, name+".log"), nil, argv[0], argv[1:]...)
	if err != nil {
		return nil, err
	}
	if err := proc.WaitListening(ctx, p, addr, 10*time.Second); err != nil {
		p.Stop(time.Second)
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &Broker{Name: name, Addr: addr, Proc: p}, nil
}

// listener is the Mosquitto listener line for a host:port.
func listener(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if addr[:i] == "" { // every address
		return "listener " + addr[i+1:] + "\n"
	}
	return "listener " + addr[i+1:] + " " + addr[:i] + "\n"
}
