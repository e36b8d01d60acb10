package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/shirou/gopsutil/v3/common"
	"github.com/shirou/gopsutil/v3/process"
)

// ForPID returns a Reader for the cgroup of process pid (process mode, no
// Kubernetes). The cgroup comes from /proc/<pid>/cgroup: v1 lines
// "N:ctrl1,ctrl2:/path" for cpuacct, memory and blkio, or the v2 line
// "0::/path"; on a hybrid host the v1 controllers are read. Network counters
// come from the process's /proc/<pid>/net/dev (pid wins over WithPID).
//
// Where a controller cannot describe the process alone, its fields come from
// the process itself through gopsutil, and describe that one process (not its
// children):
//
//   - v1: per controller, when the process sits in the root cgroup ("/") or
//     the controller is not mounted: cpuacct → CPUSeconds from user + system
//     CPU time; memory → MemoryBytes from RSS and MemoryLimitBytes 0; blkio →
//     DiskBytes from read_bytes + write_bytes of /proc/<pid>/io.
//   - v2: all three, when the process sits in the real root cgroup ("/"
//     without memory.current). Inside a cgroup namespace "/" is the
//     namespace's own cgroup, which has the files, so it is read as a cgroup.
//
// The cgroup is fixed at open time: a process later moved to another cgroup
// is not followed.
func ForPID(pid int, opts ...Option) (Reader, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("process cgroup: invalid PID %d", pid)
	}
	cfg := newConfig(opts)
	cfg.pid = pid
	r, err := forPID(cfg)
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	return r, nil
}

func forPID(cfg config) (*reader, error) {
	p := filepath.Join(cfg.procRoot, strconv.Itoa(cfg.pid), "cgroup")
	var f fileReader
	b, err := f.read(p)
	if err != nil {
		return nil, err
	}
	lines, err := parseProcCgroup(b)
	if err != nil {
		return nil, inFile(p, err)
	}
	l, err := loadLayout(cfg)
	if err != nil {
		return nil, err
	}
	r := newReader(cfg)
	var parts []string
	if l.useV1() {
		sets := [len(v1Controllers)]func(string) error{r.setV1CPU, r.setV1Memory, r.setV1Blkio}
		for i, c := range v1Controllers {
			h, mounted := l.v1[c]
			cgPath, listed := v1Path(lines, c)
			if !mounted || !listed || cgPath == "/" {
				parts = append(parts, c+" from the process")
				continue
			}
			dir, err := h.dir(cgPath)
			if err != nil {
				return nil, err
			}
			if err := sets[i](dir); err != nil {
				return nil, err
			}
			if c == ctrlMemory {
				r.memMount = h.mountPoint
			}
			parts = append(parts, c+" "+dir)
		}
	} else {
		cgPath, ok := v2Path(lines)
		if !ok {
			return nil, fmt.Errorf("%s has no cgroup v2 line (0::/path) though only cgroup v2 is mounted", p)
		}
		dir, err := l.v2.dir(cgPath)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(filepath.Join(dir, "memory.current")); cgPath == "/" && err != nil {
			parts = append(parts, "root cgroup: all from the process")
		} else {
			if err := r.setV2(dir); err != nil {
				return nil, err
			}
			r.memMount = l.v2.mountPoint
			parts = append(parts, "cgroup v2 "+dir)
		}
	}
	if r.cpu == 0 || r.mem == 0 || r.disk == 0 {
		ps, err := newProcStats(cfg)
		if err != nil {
			return nil, err
		}
		r.proc = ps
		for _, s := range []*source{&r.cpu, &r.mem, &r.disk} {
			if *s == 0 {
				*s = srcProc
			}
		}
	}
	r.desc = fmt.Sprintf("process %d: %s%s", cfg.pid, strings.Join(parts, ", "), r.netDesc())
	return r.finish()
}

func v1Path(lines []procCgroup, controller string) (string, bool) {
	for _, l := range lines {
		if l.ID != 0 && slices.Contains(l.Controllers, controller) {
			return l.Path, true
		}
	}
	return "", false
}

func v2Path(lines []procCgroup) (string, bool) {
	for _, l := range lines {
		if l.ID == 0 && len(l.Controllers) == 0 {
			return l.Path, true
		}
	}
	return "", false
}

// procStats reads one process's own figures through gopsutil.
type procStats struct {
	p       *process.Process
	env     common.EnvMap // points gopsutil at the configured proc root
	pidPath string        // <procRoot>/<pid>, for errors
}

func newProcStats(cfg config) (*procStats, error) {
	ps := &procStats{
		env:     common.EnvMap{common.HostProcEnvKey: cfg.procRoot},
		pidPath: filepath.Join(cfg.procRoot, strconv.Itoa(cfg.pid)),
	}
	p, err := process.NewProcessWithContext(ps.ctx(context.Background()), int32(cfg.pid))
	if err != nil {
		return nil, ps.wrap(err)
	}
	ps.p = p
	return ps, nil
}

func (ps *procStats) ctx(ctx context.Context) context.Context {
	return context.WithValue(ctx, common.EnvKey, ps.env)
}

// wrap maps gopsutil's errors for a vanished process to ErrGone.
func (ps *procStats) wrap(err error) error {
	if errors.Is(err, process.ErrorProcessNotRunning) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("read %s: %w: %w", ps.pidPath, ErrGone, err)
	}
	return fmt.Errorf("read %s: %w", ps.pidPath, err)
}

func (ps *procStats) cpuSeconds(ctx context.Context) (float64, error) {
	t, err := ps.p.TimesWithContext(ps.ctx(ctx))
	if err != nil {
		return 0, ps.wrap(err)
	}
	return t.User + t.System, nil
}

func (ps *procStats) rssBytes(ctx context.Context) (float64, error) {
	m, err := ps.p.MemoryInfoWithContext(ps.ctx(ctx))
	if err != nil {
		return 0, ps.wrap(err)
	}
	return float64(m.RSS), nil
}

func (ps *procStats) ioBytes(ctx context.Context) (float64, error) {
	io, err := ps.p.IOCountersWithContext(ps.ctx(ctx))
	if err != nil {
		return 0, ps.wrap(err)
	}
	return float64(io.ReadBytes) + float64(io.WriteBytes), nil
}
