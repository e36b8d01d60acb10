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
	conf := filepath.Join(dir, name+".conf")
	if err := os.WriteFile(conf, []byte(listener(addr)+"allow_anonymous true\npersistence false\nlog_dest stdout\nconnection_messages true\n"), 0o644); err != nil {
		return nil, err
	}
	p, err := proc.Start(name, filepath.Join(dir, name+".log"), nil, bin, "-c", conf)
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
	return "listener " + addr[i+1:] + " " + addr[:i] + "\n"
}
