package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// source says where one field of Stats comes from.
type source uint8

const (
	srcV2   source = iota + 1 // cgroup v2 file
	srcV1                     // cgroup v1 controller file
	srcProc                   // the process itself, through gopsutil
)

// v1 blkio files in the order cAdvisor falls back through them: the throttle
// statistics are accounted for every bio whatever the I/O scheduler; the
// plain ones only with CFQ/BFQ; the non-recursive ones on kernels that lack
// the recursive files.
var blkioFiles = [...]string{
	"blkio.throttle.io_service_bytes_recursive",
	"blkio.io_service_bytes_recursive",
	"blkio.throttle.io_service_bytes",
	"blkio.io_service_bytes",
}

// reader reads one target. Every file path is built once, at open time, so a
// Read only opens, reads and parses.
type reader struct {
	now  func() time.Time
	f    fileReader
	desc string

	cpu     source
	cpuFile string // cpu.stat or cpuacct.usage

	mem       source
	memMount  string // mount point of the memory hierarchy, for MemoryReference
	memFile   string // memory.current or memory.usage_in_bytes
	limitFile string // memory.max or memory.limit_in_bytes

	disk     source
	diskFile string // io.stat
	// blkio lists the v1 files that exist, in fallback order. blkioPick is
	// the first that has had per-device entries, then used for good so the
	// counter never switches source (and jumps) mid-life; -1 until then.
	blkio     []string
	blkioPick int

	netDev   string // /proc/<pid>/net/dev; "" without a PID
	procRoot string

	proc *procStats // non-nil when some field comes from the process
}

func newReader(cfg config) *reader {
	r := &reader{now: cfg.now, blkioPick: -1, procRoot: cfg.procRoot}
	if cfg.pid > 0 {
		r.netDev = filepath.Join(cfg.procRoot, strconv.Itoa(cfg.pid), "net", "dev")
	}
	return r
}

// String describes where the reader reads from, for logs.
func (r *reader) String() string { return r.desc }

// Read implements Reader.
func (r *reader) Read(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	s := Stats{Time: r.now()}
	var err error
	if s.CPUSeconds, err = r.readCPU(ctx); err != nil {
		return Stats{}, err
	}
	if s.MemoryBytes, s.MemoryLimitBytes, err = r.readMemory(ctx); err != nil {
		return Stats{}, err
	}
	if s.DiskBytes, err = r.readDisk(ctx); err != nil {
		return Stats{}, err
	}
	if r.netDev != "" {
		b, err := r.f.read(r.netDev)
		if err != nil {
			return Stats{}, err
		}
		n, err := parseNetDev(b)
		if err != nil {
			return Stats{}, inFile(r.netDev, err)
		}
		s.NetworkBytes, s.HasNetwork = float64(n), true
	}
	return s, nil
}

// readUint reads a single-number file with parse.
func (r *reader) readUint(p string, parse func([]byte) (uint64, error)) (uint64, error) {
	b, err := r.f.read(p)
	if err != nil {
		return 0, err
	}
	v, err := parse(b)
	if err != nil {
		return 0, inFile(p, err)
	}
	return v, nil
}

func (r *reader) readCPU(ctx context.Context) (float64, error) {
	switch r.cpu {
	case srcV2:
		usec, err := r.readUint(r.cpuFile, parseCPUStat)
		return float64(usec) / 1e6, err
	case srcV1:
		ns, err := r.readUint(r.cpuFile, parseUintFile)
		return float64(ns) / 1e9, err
	default:
		return r.proc.cpuSeconds(ctx)
	}
}

func (r *reader) readMemory(ctx context.Context) (used, limit float64, err error) {
	var u, l uint64
	switch r.mem {
	case srcV2:
		if u, err = r.readUint(r.memFile, parseUintFile); err != nil {
			return 0, 0, err
		}
		l, err = r.readUint(r.limitFile, parseMemoryMax)
	case srcV1:
		if u, err = r.readUint(r.memFile, parseUintFile); err != nil {
			return 0, 0, err
		}
		l, err = r.readUint(r.limitFile, parseV1Limit)
	default:
		// A process in the root memory cgroup has no limit of its own.
		used, err = r.proc.rssBytes(ctx)
		return used, 0, err
	}
	return float64(u), float64(l), err
}

func (r *reader) readDisk(ctx context.Context) (float64, error) {
	switch r.disk {
	case srcV2:
		n, err := r.readUint(r.diskFile, parseIOStat)
		return float64(n), err
	case srcV1:
		n, err := r.readBlkio()
		return float64(n), err
	default:
		return r.proc.ioBytes(ctx)
	}
}

func (r *reader) readBlkioFile(p string) (sum uint64, entries int, err error) {
	b, err := r.f.read(p)
	if err != nil {
		return 0, 0, err
	}
	sum, entries, err = parseBlkio(b)
	if err != nil {
		return 0, 0, inFile(p, err)
	}
	return sum, entries, nil
}

// readBlkio returns Read+Write bytes from the first blkio file with entries,
// and 0 when none has any yet: a cgroup that has done no block I/O (or whose
// I/O none of the files accounts) shows only "Total 0".
func (r *reader) readBlkio() (uint64, error) {
	if r.blkioPick >= 0 {
		sum, _, err := r.readBlkioFile(r.blkio[r.blkioPick])
		return sum, err
	}
	for i, p := range r.blkio {
		sum, entries, err := r.readBlkioFile(p)
		if err != nil {
			return 0, err
		}
		if entries > 0 {
			r.blkioPick = i
			return sum, nil
		}
	}
	return 0, nil
}

// The set* methods choose a field's source and check, at open time, that its
// files are there, so that a file missing later can only mean the target is
// gone.

func (r *reader) setV2(dir string) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	r.cpu, r.cpuFile = srcV2, filepath.Join(dir, "cpu.stat")
	r.mem, r.memFile, r.limitFile = srcV2, filepath.Join(dir, "memory.current"), filepath.Join(dir, "memory.max")
	r.disk, r.diskFile = srcV2, filepath.Join(dir, "io.stat")
	hint := "enable the controller for it in its parent's cgroup.subtree_control (on a hybrid host, read the v1 hierarchy instead)"
	if err := checkFile(r.cpuFile, "cpu.stat is in every cgroup v2 directory: is this a cgroup v2 directory?"); err != nil {
		return err
	}
	for _, p := range []string{r.memFile, r.limitFile} {
		if err := checkFile(p, "the memory controller is not enabled for this cgroup: "+hint); err != nil {
			return err
		}
	}
	return checkFile(r.diskFile, "the io controller is not enabled for this cgroup: "+hint)
}

func (r *reader) setV1CPU(dir string) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	r.cpu, r.cpuFile = srcV1, filepath.Join(dir, "cpuacct.usage")
	return checkFile(r.cpuFile, "not a cpuacct cgroup directory")
}

func (r *reader) setV1Memory(dir string) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	r.mem, r.memFile, r.limitFile = srcV1, filepath.Join(dir, "memory.usage_in_bytes"), filepath.Join(dir, "memory.limit_in_bytes")
	if err := checkFile(r.memFile, "not a memory cgroup directory"); err != nil {
		return err
	}
	return checkFile(r.limitFile, "not a memory cgroup directory")
}

func (r *reader) setV1Blkio(dir string) error {
	if err := checkDir(dir); err != nil {
		return err
	}
	r.disk, r.blkio = srcV1, nil
	for _, name := range blkioFiles {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			r.blkio = append(r.blkio, p)
		}
	}
	if len(r.blkio) == 0 {
		return fmt.Errorf("no blkio statistics in %s (looked for %s): not a blkio cgroup directory", dir, strings.Join(blkioFiles[:], ", "))
	}
	return nil
}

func checkDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup directory %s does not exist (a restarted container has a new ID: look it up again): %w", dir, err)
		}
		return fmt.Errorf("cgroup directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return nil
}

func checkFile(p, hint string) error {
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s is missing: %s: %w", p, hint, err)
		}
		return fmt.Errorf("cgroup file: %w", err)
	}
	return nil
}

// finish validates the reader with one read, so a wrong path, a missing
// permission or an unparseable file fails at open time rather than at the
// first sample.
func (r *reader) finish() (*reader, error) {
	if _, err := r.Read(context.Background()); err != nil {
		return nil, fmt.Errorf("first read: %w", err)
	}
	return r, nil
}

// Open returns a Reader for the cgroup p and, with WithPID, the network
// namespace of that process.
//
// p is either a cgroup directory (under /sys/fs/cgroup/<controller> on v1,
// /sys/fs/cgroup on v2, or under the WithCgroupRoot directory), or a path
// inside the cgroup hierarchy such as /kubepods/burstable/pod<uid>/<id> as
// /proc/<pid>/cgroup shows it. On cgroup v1 a directory under one
// controller's mount stands for the same path in the others: the reader uses
// the cpuacct, memory and blkio hierarchies wherever they are mounted
// (separately or combined, as in "cpu,cpuacct"). On a hybrid host, where v1
// controllers and a controller-less cgroup2 mount coexist, v1 is read.
func Open(p string, opts ...Option) (Reader, error) {
	cfg := newConfig(opts)
	l, err := loadLayout(cfg)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", p, err)
	}
	r, err := openIn(cfg, l, p)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", p, err)
	}
	return r, nil
}

func openIn(cfg config, l layout, p string) (*reader, error) {
	hp := path.Clean("/" + filepath.ToSlash(p)) // hierarchy path, unless p is a directory under a mount
	if abs, err := filepath.Abs(p); err == nil {
		if h, ok := l.owner(abs); ok {
			if h.v2 {
				return openV2(cfg, abs, h.mountPoint)
			}
			hp, _ = h.path(abs)
			return openV1(cfg, l, hp)
		}
	}
	if l.useV1() {
		return openV1(cfg, l, hp)
	}
	dir, err := l.v2.dir(hp)
	if err != nil {
		return nil, err
	}
	return openV2(cfg, dir, l.v2.mountPoint)
}

func openV2(cfg config, dir, mount string) (*reader, error) {
	r := newReader(cfg)
	r.memMount = mount
	if err := r.setV2(dir); err != nil {
		return nil, err
	}
	r.desc = "cgroup v2 " + dir + r.netDesc()
	return r.finish()
}

// openV1 opens the hierarchy path hp in each v1 controller.
func openV1(cfg config, l layout, hp string) (*reader, error) {
	r := newReader(cfg)
	var dirs [len(v1Controllers)]string
	for i, c := range v1Controllers {
		h, ok := l.v1[c]
		if !ok {
			return nil, fmt.Errorf("cgroup v1 controller %s is not mounted (per %s)", c, l.source)
		}
		dir, err := h.dir(hp)
		if err != nil {
			return nil, err
		}
		dirs[i] = dir
	}
	if err := r.setV1CPU(dirs[0]); err != nil {
		return nil, err
	}
	if err := r.setV1Memory(dirs[1]); err != nil {
		return nil, err
	}
	r.memMount = l.v1[ctrlMemory].mountPoint
	if err := r.setV1Blkio(dirs[2]); err != nil {
		return nil, err
	}
	r.desc = fmt.Sprintf("cgroup v1 %s (cpuacct %s, memory %s, blkio %s)%s", hp, dirs[0], dirs[1], dirs[2], r.netDesc())
	return r.finish()
}

func (r *reader) netDesc() string {
	if r.netDev == "" {
		return ", no network (no PID)"
	}
	return ", network " + r.netDev
}
