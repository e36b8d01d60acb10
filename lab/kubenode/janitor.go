package kubenode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// janitorScript tears a node down: every process in its cgroups (frozen first,
// so nothing forks meanwhile, then SIGKILL), its cgroups in every hierarchy,
// then its files. With its network and mount namespaces' last processes gone,
// the namespaces, the veth pair, the routes through it and every mount the
// node made go too. It runs when its standard input ends: at Stop, or when the
// lab process dies (the kernel closes the pipe's other end).
//
// $1 is the cgroup name (amf-node<i>), the other arguments the paths to remove.
const janitorScript = `
set -u
cg="$1"; shift
[ "${AMF_JANITOR_NOW:-}" = 1 ] || { read -r _ || true; }
procs() { find /sys/fs/cgroup/*/"$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u; }
fz=/sys/fs/cgroup/freezer/"$cg"/freezer.state
killed=""
i=0
while [ $i -lt 200 ]; do
	p=$(procs)
	[ -z "$p" ] && break
	killed="$killed $p"
	[ -f "$fz" ] && echo FROZEN >"$fz" 2>/dev/null
	kill -9 $p 2>/dev/null
	[ -f "$fz" ] && echo THAWED >"$fz" 2>/dev/null
	sleep 0.05
	i=$((i + 1))
done
[ -n "$(procs)" ] && echo "kubenode janitor: processes left in cgroup $cg: $(procs | tr '\n' ' ')" >&2
# A killed process leaves its cgroup at once but stays a zombie until it is
# reaped: wait until every one is gone, so that the end of the teardown means it.
for p in $killed; do
	i=0
	while [ -e /proc/$p ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
	[ -e /proc/$p ] && echo "kubenode janitor: process $p not reaped" >&2
done
i=0
while [ $i -lt 100 ]; do
	left=0
	for h in /sys/fs/cgroup/*/"$cg"; do
		[ -d "$h" ] || continue
		find "$h" -depth -type d -exec rmdir {} + 2>/dev/null
		[ -d "$h" ] && left=1
	done
	[ $left = 0 ] && break
	sleep 0.05
	i=$((i + 1))
done
for h in /sys/fs/cgroup/*/"$cg"; do [ -d "$h" ] && echo "kubenode janitor: cgroup $h left" >&2; done
# A LAN node's host routes (through its LAN's uplink, which may outlive it).
if [ -n "${AMF_JANITOR_ROUTES:-}" ]; then
	echo "$AMF_JANITOR_ROUTES" | tr ';' '\n' | while read -r r; do
		[ -n "$r" ] && ip route del $r 2>/dev/null
	done
fi
# A link that goes with the namespaces (the kernel dismantles a namespace
# asynchronously): wait until it is gone, so that the end of the teardown means it.
if [ -n "${AMF_JANITOR_LINK:-}" ]; then
	i=0
	while ip link show dev "$AMF_JANITOR_LINK" >/dev/null 2>&1 && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
	ip link show dev "$AMF_JANITOR_LINK" >/dev/null 2>&1 && echo "kubenode janitor: link $AMF_JANITOR_LINK left" >&2
fi
for d in "$@"; do rm -rf -- "$d"; done
# The kubelet sets kernel tunables machine-wide at start (kubeletTunables): the
# last node to go puts back what the machine had before the first one came.
if [ -n "${AMF_JANITOR_SLOT:-}" ]; then
	exec 8>>` + lockDir + `/sysctl.lock
	flock 8
	others=0
	for l in ` + lockDir + `/[0-9]*.lock; do
		[ "$l" = "` + lockDir + `/$AMF_JANITOR_SLOT.lock" ] && continue
		flock -n "$l" true || others=1
	done
	if [ $others = 0 ] && [ -f ` + lockDir + `/sysctl.orig ]; then
		while read -r name value; do
			echo "$value" >/proc/sys/"$name" || echo "kubenode janitor: could not restore $name" >&2
		done <` + lockDir + `/sysctl.orig
		rm -f ` + lockDir + `/sysctl.orig
	fi
fi
exit 0
`

// kubeletTunables are the sysctls the kubelet sets for the whole machine when
// it starts (protectKernelDefaults: false, its default), as paths under
// /proc/sys. A lab node must leave the machine as it found it.
var kubeletTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// saveTunables records the machine's values of kubeletTunables, unless a
// running node already did (then they are the kubelet's, not the machine's).
func saveTunables() error {
	lock, err := os.OpenFile(filepath.Join(lockDir, "sysctl.lock"), os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	orig := filepath.Join(lockDir, "sysctl.orig")
	if _, err := os.Stat(orig); err == nil {
		return nil
	}
	var b strings.Builder
	for _, t := range kubeletTunables {
		v, err := os.ReadFile(filepath.Join("/proc/sys", t))
		if err != nil {
			continue // not on this kernel: the kubelet skips it too
		}
		fmt.Fprintf(&b, "%s %s\n", t, strings.TrimSpace(string(v)))
	}
	return writeAtomic(orig, []byte(b.String()), 0o600)
}

// janitor is the process that tears the node down when its pipe closes.
type janitor struct {
	cmd  *exec.Cmd
	pipe *os.File // write end: closing it starts the teardown
	done chan struct{}
}

// startJanitor starts the janitor for cgroup cg and paths. lock (the node
// index's lock file) is handed to it, so the index stays taken until the
// teardown has finished, even after the lab process is gone. slot is the
// node's (for the kernel tunables; -1 for a LAN); env adds AMF_JANITOR_ROUTES
// (host routes to delete, ';'-separated) or AMF_JANITOR_LINK (a link to
// wait for the end of).
func startJanitor(cg string, slot int, paths []string, lock *os.File, logPath string, env []string) (*janitor, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", janitorScript, "kubenode-janitor", cg}, paths...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, logf, logf
	cmd.Env = append(os.Environ(), env...)
	if slot >= 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("AMF_JANITOR_SLOT=%d", slot))
	}
	cmd.ExtraFiles = []*os.File{lock}
	// Its own process group and no death signal: it must outlive the lab process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		logf.Close()
		return nil, fmt.Errorf("start the node's janitor: %w", err)
	}
	r.Close()
	logf.Close()
	j := &janitor{cmd: cmd, pipe: w, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(j.done) }()
	return j, nil
}

// run tears down at once and waits.
func (j *janitor) run() {
	j.pipe.Close()
	<-j.done
}

// cleanStale tears down what a node with the same index left behind (its
// janitor was killed too): run the same script at once, synchronously.
func cleanStale(cg string, paths []string) error {
	cmd := exec.Command("/bin/sh", append([]string{"-c", janitorScript, "kubenode-janitor", cg}, paths...)...)
	cmd.Env = append(os.Environ(), "AMF_JANITOR_NOW=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		return fmt.Errorf("clean what an earlier node left in cgroup %s: %v: %s", cg, err, out)
	}
	return nil
}
