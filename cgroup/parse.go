package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The parsers below are pure functions over a file's bytes so they can be
// table-tested and fuzzed without a kernel. They return a *SyntaxError that
// names the offending line; the caller adds the file name. They never return
// a silent zero for a malformed file: a number that does not parse, a line of
// the wrong shape or a missing key is an error.

// SyntaxError reports a malformed line in a kernel statistics file.
type SyntaxError struct {
	File string // set by the caller that read the file; empty from the parsers
	Line int    // 1-based; 0 when the problem is the file as a whole
	Msg  string
}

func (e *SyntaxError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

func syntaxErr(line int, format string, args ...any) error {
	return &SyntaxError{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// inFile names the file in a parser's error, keeping other errors wrapped.
func inFile(path string, err error) error {
	var se *SyntaxError
	if errors.As(err, &se) {
		c := *se
		c.File = path
		return &c
	}
	return fmt.Errorf("%s: %w", path, err)
}

// lineScanner walks b line by line without allocating.
type lineScanner struct {
	rest []byte
	n    int
}

func (s *lineScanner) next() ([]byte, bool) {
	if len(s.rest) == 0 {
		return nil, false
	}
	s.n++
	i := bytes.IndexByte(s.rest, '\n')
	if i < 0 {
		line := s.rest
		s.rest = nil
		return line, true
	}
	line := s.rest[:i]
	s.rest = s.rest[i+1:]
	return line, true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

// nextField splits off the first blank-separated field of b.
func nextField(b []byte) (field, rest []byte) {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isSpace(b[j]) {
		j++
	}
	return b[i:j], b[j:]
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if !isSpace(c) {
			return false
		}
	}
	return true
}

// parseDec parses an unsigned decimal without allocating (strconv needs a
// string). It rejects signs, empty input and overflow.
func parseDec(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (^uint64(0)-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

func addChecked(sum, v uint64, line int) (uint64, error) {
	if sum+v < sum {
		return 0, syntaxErr(line, "sum overflows 64 bits")
	}
	return sum + v, nil
}

// quote shortens a field for an error message.
func quote(b []byte) string {
	const max = 40
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + "..."
	}
	return strconv.Quote(string(b))
}

// singleValue returns the one value of a single-value file: one field and an
// optional trailing newline.
func singleValue(b []byte) ([]byte, error) {
	b = bytes.TrimSuffix(b, []byte{'\n'})
	if bytes.IndexByte(b, '\n') >= 0 {
		return nil, syntaxErr(2, "want a single line")
	}
	f, rest := nextField(b)
	if len(f) == 0 {
		return nil, syntaxErr(1, "empty, want a value")
	}
	if !isBlank(rest) {
		return nil, syntaxErr(1, "trailing data after %s", quote(f))
	}
	return f, nil
}

// parseUintFile parses a file holding one unsigned decimal and a newline,
// such as cpuacct.usage, memory.current or memory.usage_in_bytes.
func parseUintFile(b []byte) (uint64, error) {
	f, err := singleValue(b)
	if err != nil {
		return 0, err
	}
	v, ok := parseDec(f)
	if !ok {
		return 0, syntaxErr(1, "%s is not an unsigned number", quote(f))
	}
	return v, nil
}

// parseMemoryMax parses cgroup v2 memory.max: a number, or "max" for no
// limit, reported as 0.
func parseMemoryMax(b []byte) (uint64, error) {
	f, err := singleValue(b)
	if err != nil {
		return 0, err
	}
	if string(f) == "max" {
		return 0, nil
	}
	v, ok := parseDec(f)
	if !ok {
		return 0, syntaxErr(1, "%s is neither \"max\" nor an unsigned number", quote(f))
	}
	return v, nil
}

// v1NoLimit is the smallest value cgroup v1 prints for "no limit": the kernel
// shows PAGE_COUNTER_MAX rounded down to a page (9223372036854771712 on 4 KiB
// pages, a little less on 16/64 KiB pages), never a real limit.
const v1NoLimit = 1 << 62

// parseV1Limit parses memory.limit_in_bytes, mapping "no limit" to 0.
func parseV1Limit(b []byte) (uint64, error) {
	v, err := parseUintFile(b)
	if err != nil {
		return 0, err
	}
	if v >= v1NoLimit {
		return 0, nil
	}
	return v, nil
}

// parseCPUStat returns usage_usec from cgroup v2 cpu.stat ("key value"
// lines, all integers).
func parseCPUStat(b []byte) (uint64, error) { return parseFlatKey(b, "usage_usec") }

// parseOOMKills returns oom_kill from cgroup v2 memory.events or v1
// memory.oom_control, both "key value" lines of integers.
func parseOOMKills(b []byte) (uint64, error) { return parseFlatKey(b, "oom_kill") }

// parseFlatKey returns the value of key in a flat keyed file: "key value"
// lines, all values unsigned integers, each key once.
func parseFlatKey(b []byte, want string) (uint64, error) {
	s := lineScanner{rest: b}
	var value uint64
	found := false
	for {
		line, ok := s.next()
		if !ok {
			break
		}
		if isBlank(line) {
			continue
		}
		key, rest := nextField(line)
		val, rest := nextField(rest)
		if len(val) == 0 || !isBlank(rest) {
			return 0, syntaxErr(s.n, "want \"key value\", got %s", quote(line))
		}
		v, ok := parseDec(val)
		if !ok {
			return 0, syntaxErr(s.n, "%s: %s is not an unsigned number", quote(key), quote(val))
		}
		if string(key) == want {
			if found {
				return 0, syntaxErr(s.n, "%s repeated", want)
			}
			value, found = v, true
		}
	}
	if !found {
		return 0, syntaxErr(0, "no %s line", want)
	}
	return value, nil
}

// validDevice reports whether b looks like "MAJ:MIN".
func validDevice(b []byte) bool {
	maj, min, ok := bytes.Cut(b, []byte{':'})
	if !ok {
		return false
	}
	_, ok1 := parseDec(maj)
	_, ok2 := parseDec(min)
	return ok1 && ok2
}

// parseIOStat sums rbytes and wbytes over all devices of cgroup v2 io.stat
// ("MAJ:MIN key=value ..."). An empty file (no I/O yet) is 0. Keys other than
// rbytes and wbytes are not checked for being numbers because io.latency and
// io.cost add keys such as "depth=max" and "cost.vrate=100.00".
func parseIOStat(b []byte) (uint64, error) {
	s := lineScanner{rest: b}
	var sum uint64
	for {
		line, ok := s.next()
		if !ok {
			break
		}
		if isBlank(line) {
			continue
		}
		dev, rest := nextField(line)
		if !validDevice(dev) {
			return 0, syntaxErr(s.n, "want MAJ:MIN first, got %s", quote(dev))
		}
		for {
			var kv []byte
			kv, rest = nextField(rest)
			if len(kv) == 0 {
				break
			}
			k, v, ok := bytes.Cut(kv, []byte{'='})
			if !ok || len(k) == 0 {
				return 0, syntaxErr(s.n, "want key=value, got %s", quote(kv))
			}
			if string(k) != "rbytes" && string(k) != "wbytes" {
				continue
			}
			n, ok := parseDec(v)
			if !ok {
				return 0, syntaxErr(s.n, "%s: %s is not an unsigned number", k, quote(v))
			}
			var err error
			if sum, err = addChecked(sum, n, s.n); err != nil {
				return 0, err
			}
		}
	}
	return sum, nil
}

// parseBlkio sums the Read and Write lines of a cgroup v1 blkio
// io_service_bytes file ("MAJ:MIN Op value" lines and a final "Total value").
// entries counts the per-device lines, so the caller can tell a file that has
// none (only "Total 0": the cgroup's I/O is not accounted in this file) from
// one that says zero.
func parseBlkio(b []byte) (sum uint64, entries int, err error) {
	s := lineScanner{rest: b}
	for {
		line, ok := s.next()
		if !ok {
			break
		}
		if isBlank(line) {
			continue
		}
		f1, rest := nextField(line)
		f2, rest := nextField(rest)
		f3, rest := nextField(rest)
		if len(f2) == 0 || !isBlank(rest) {
			return 0, 0, syntaxErr(s.n, "want \"MAJ:MIN Op value\" or \"Total value\", got %s", quote(line))
		}
		if len(f3) == 0 {
			if string(f1) != "Total" {
				return 0, 0, syntaxErr(s.n, "want \"Total value\", got %s", quote(line))
			}
			if _, ok := parseDec(f2); !ok {
				return 0, 0, syntaxErr(s.n, "Total: %s is not an unsigned number", quote(f2))
			}
			continue
		}
		if !validDevice(f1) {
			return 0, 0, syntaxErr(s.n, "want MAJ:MIN first, got %s", quote(f1))
		}
		v, ok := parseDec(f3)
		if !ok {
			return 0, 0, syntaxErr(s.n, "%s: %s is not an unsigned number", quote(f2), quote(f3))
		}
		entries++
		if string(f2) == "Read" || string(f2) == "Write" {
			if sum, err = addChecked(sum, v, s.n); err != nil {
				return 0, 0, err
			}
		}
	}
	return sum, entries, nil
}

// netDevFields is the number of counters per interface in /proc/net/dev
// (8 receive, 8 transmit) since Linux 2.6.
const netDevFields = 16

// parseNetDev sums receive and transmit bytes over all interfaces of
// /proc/<pid>/net/dev except the loopback, which carries no pod traffic.
func parseNetDev(b []byte) (uint64, error) {
	s := lineScanner{rest: b}
	for i := 0; i < 2; i++ {
		line, ok := s.next()
		if !ok {
			return 0, syntaxErr(0, "missing the two header lines")
		}
		if bytes.IndexByte(line, '|') < 0 {
			return 0, syntaxErr(s.n, "want a header line with '|', got %s", quote(line))
		}
	}
	var sum uint64
	for {
		line, ok := s.next()
		if !ok {
			break
		}
		if isBlank(line) {
			continue
		}
		// Interface names cannot contain ':', and long names are followed by
		// the first counter with no space, so cut at the first colon.
		name, rest, ok := bytes.Cut(line, []byte{':'})
		name = bytes.TrimLeft(name, " \t")
		if !ok || len(name) == 0 {
			return 0, syntaxErr(s.n, "want \"iface: counters\", got %s", quote(line))
		}
		var rx, tx uint64
		n := 0
		for {
			var f []byte
			f, rest = nextField(rest)
			if len(f) == 0 {
				break
			}
			v, ok := parseDec(f)
			if !ok {
				return 0, syntaxErr(s.n, "%s: counter %d: %s is not an unsigned number", quote(name), n+1, quote(f))
			}
			switch n {
			case 0:
				rx = v
			case 8:
				tx = v
			}
			n++
		}
		if n < netDevFields {
			return 0, syntaxErr(s.n, "%s: %d counters, want %d", quote(name), n, netDevFields)
		}
		if string(name) == "lo" {
			continue
		}
		var err error
		if sum, err = addChecked(sum, rx, s.n); err != nil {
			return 0, err
		}
		if sum, err = addChecked(sum, tx, s.n); err != nil {
			return 0, err
		}
	}
	return sum, nil
}

// procCgroup is one line of /proc/<pid>/cgroup.
type procCgroup struct {
	ID          int      // hierarchy ID; 0 for the cgroup v2 unified hierarchy
	Controllers []string // v1 controllers ("cpu", "cpuacct") or "name=systemd"; empty for v2
	Path        string   // path inside the hierarchy, relative to the reader's cgroup namespace
}

// parseProcCgroup parses /proc/<pid>/cgroup: "ID:controllers:path" lines. The
// path may itself contain ':', so only the first two colons separate fields.
func parseProcCgroup(b []byte) ([]procCgroup, error) {
	s := lineScanner{rest: b}
	var out []procCgroup
	for {
		line, ok := s.next()
		if !ok {
			break
		}
		if isBlank(line) {
			continue
		}
		id, rest, ok1 := bytes.Cut(line, []byte{':'})
		ctrls, path, ok2 := bytes.Cut(rest, []byte{':'})
		if !ok1 || !ok2 {
			return nil, syntaxErr(s.n, "want \"ID:controllers:path\", got %s", quote(line))
		}
		n, ok := parseDec(id)
		if !ok || n > 1<<31 {
			return nil, syntaxErr(s.n, "hierarchy ID %s is not a number", quote(id))
		}
		if len(path) == 0 || path[0] != '/' {
			return nil, syntaxErr(s.n, "path %s is not absolute", quote(path))
		}
		if len(ctrls) == 0 && n != 0 {
			return nil, syntaxErr(s.n, "hierarchy %d has no controllers", n)
		}
		var cs []string
		if len(ctrls) > 0 {
			cs = strings.Split(string(ctrls), ",")
			for _, c := range cs {
				if c == "" {
					return nil, syntaxErr(s.n, "empty controller name in %s", quote(ctrls))
				}
			}
		}
		out = append(out, procCgroup{ID: int(n), Controllers: cs, Path: string(path)})
	}
	if len(out) == 0 {
		return nil, syntaxErr(0, "no cgroup lines")
	}
	return out, nil
}

// mountInfo is the part of a /proc/<pid>/mountinfo line this package needs.
type mountInfo struct {
	Root         string   // path of the mounted directory inside its filesystem (for cgroups: inside the hierarchy)
	MountPoint   string   // where it is mounted
	FSType       string   // "cgroup", "cgroup2", ...
	Source       string   // mount source
	SuperOptions []string // per-superblock options; for cgroup v1 they name the controllers
}

// parseMountInfo parses /proc/<pid>/mountinfo (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// Optional fields run up to the "-" separator.
func parseMountInfo(b []byte) ([]mountInfo, error) {
	s := lineScanner{rest: b}
	var out []mountInfo
	var fields [][]byte
	for {
		line, ok := s.next()
		if !ok {
			break
		}
		if isBlank(line) {
			continue
		}
		fields = fields[:0]
		for rest := line; ; {
			var f []byte
			f, rest = nextField(rest)
			if len(f) == 0 {
				break
			}
			fields = append(fields, f)
		}
		sep := -1
		for i := 6; i < len(fields); i++ {
			if string(fields[i]) == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 6 || sep < 0 || len(fields)-sep-1 < 3 {
			return nil, syntaxErr(s.n, "want \"ID parent MAJ:MIN root mountpoint options [optional...] - fstype source superoptions\", got %s", quote(line))
		}
		if _, ok := parseDec(fields[0]); !ok {
			return nil, syntaxErr(s.n, "mount ID %s is not a number", quote(fields[0]))
		}
		if !validDevice(fields[2]) {
			return nil, syntaxErr(s.n, "want MAJ:MIN, got %s", quote(fields[2]))
		}
		root, err := unescapeMount(fields[3])
		if err != nil {
			return nil, syntaxErr(s.n, "root: %v", err)
		}
		mp, err := unescapeMount(fields[4])
		if err != nil {
			return nil, syntaxErr(s.n, "mount point: %v", err)
		}
		src, err := unescapeMount(fields[sep+2])
		if err != nil {
			return nil, syntaxErr(s.n, "source: %v", err)
		}
		out = append(out, mountInfo{
			Root:         root,
			MountPoint:   mp,
			FSType:       string(fields[sep+1]),
			Source:       src,
			SuperOptions: strings.Split(string(fields[sep+3]), ","),
		})
	}
	return out, nil
}

// unescapeMount undoes the kernel's octal escaping ("\040" for a space) of
// paths in mountinfo.
func unescapeMount(b []byte) (string, error) {
	if bytes.IndexByte(b, '\\') < 0 {
		return string(b), nil
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			out = append(out, b[i])
			continue
		}
		if i+3 >= len(b) {
			return "", fmt.Errorf("truncated escape in %s", quote(b))
		}
		var v int
		for _, c := range b[i+1 : i+4] {
			if c < '0' || c > '7' {
				return "", fmt.Errorf("bad escape in %s", quote(b))
			}
			v = v*8 + int(c-'0')
		}
		if v > 0xff {
			return "", fmt.Errorf("bad escape in %s", quote(b))
		}
		out = append(out, byte(v))
		i += 3
	}
	return string(out), nil
}

// parseMemTotal returns MemTotal of /proc/meminfo in bytes: the line
// "MemTotal: <n> kB" (the kernel's kB are KiB). Other lines are not read.
func parseMemTotal(b []byte) (uint64, error) {
	s := lineScanner{rest: b}
	for {
		line, ok := s.next()
		if !ok {
			return 0, syntaxErr(0, "no MemTotal line")
		}
		key, rest := nextField(line)
		if string(key) != "MemTotal:" {
			continue
		}
		val, rest := nextField(rest)
		unit, rest := nextField(rest)
		if string(unit) != "kB" || !isBlank(rest) {
			return 0, syntaxErr(s.n, "want \"MemTotal: <n> kB\", got %s", quote(line))
		}
		v, ok := parseDec(val)
		if !ok || v == 0 || v > ^uint64(0)>>10 {
			return 0, syntaxErr(s.n, "MemTotal %s is not a positive number of kB", quote(val))
		}
		return v << 10, nil
	}
}
