package cgroup

import (
	"errors"
	"math/bits"
	"strconv"
	"strings"
	"testing"
)

// The fuzzers check that the byte-level parsers never panic, that every
// error is a *SyntaxError on a line that exists, and, where the format is
// simple enough, that they agree with a plain strings/strconv reference
// implementation of the same rules. Seed corpora: testdata/fuzz/<FuzzName>/.

// fields splits like the parsers do: on blanks, tabs and carriage returns.
func fields(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '\t' || r == '\r' })
}

func refUint(s string) (uint64, bool) {
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func refAdd(sum, v uint64) (uint64, bool) {
	s, carry := bits.Add64(sum, v, 0)
	return s, carry == 0
}

func refDevice(s string) bool {
	maj, min, ok := strings.Cut(s, ":")
	_, ok1 := refUint(maj)
	_, ok2 := refUint(min)
	return ok && ok1 && ok2
}

// checkErr fails unless err is a *SyntaxError whose line is in the input.
func checkErr(t *testing.T, in []byte, err error) {
	t.Helper()
	var se *SyntaxError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T) is not a *SyntaxError", err, err)
	}
	if lines := strings.Count(string(in), "\n") + 1; se.Line < 0 || se.Line > lines {
		t.Fatalf("error on line %d of a %d-line input: %v", se.Line, lines, err)
	}
	if se.Msg == "" {
		t.Fatal("error without message")
	}
}

// agree compares a parser's result with the reference's.
func agree(t *testing.T, in []byte, got uint64, err error, want uint64, ok bool) {
	t.Helper()
	if err != nil {
		checkErr(t, in, err)
	}
	if (err == nil) != ok {
		t.Fatalf("parser err = %v, reference ok = %v, input %q", err, ok, in)
	}
	if ok && got != want {
		t.Fatalf("parser = %d, reference = %d, input %q", got, want, in)
	}
}

func refUintFile(s string) (uint64, bool) {
	s = strings.TrimSuffix(s, "\n")
	if strings.Contains(s, "\n") {
		return 0, false
	}
	f := fields(s)
	if len(f) != 1 {
		return 0, false
	}
	return refUint(f[0])
}

func FuzzParseUintFile(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := parseUintFile(in)
		want, ok := refUintFile(string(in))
		agree(t, in, got, err, want, ok)

		// memory.max: "max" or the same number.
		got, err = parseMemoryMax(in)
		if s := strings.TrimSuffix(string(in), "\n"); !strings.Contains(s, "\n") && len(fields(s)) == 1 && fields(s)[0] == "max" {
			want, ok = 0, true
		}
		agree(t, in, got, err, want, ok)

		// memory.limit_in_bytes: the number, 0 from 1<<62 up.
		got, err = parseV1Limit(in)
		want, ok = refUintFile(string(in))
		if want >= 1<<62 {
			want = 0
		}
		agree(t, in, got, err, want, ok)
	})
}

func refCPUStat(s string) (uint64, bool) {
	var usage uint64
	found := false
	for _, line := range strings.Split(s, "\n") {
		f := fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return 0, false
		}
		v, ok := refUint(f[1])
		if !ok {
			return 0, false
		}
		if f[0] == "usage_usec" {
			if found {
				return 0, false
			}
			usage, found = v, true
		}
	}
	return usage, found
}

func FuzzParseCPUStat(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := parseCPUStat(in)
		want, ok := refCPUStat(string(in))
		agree(t, in, got, err, want, ok)
	})
}

func refIOStat(s string) (uint64, bool) {
	var sum uint64
	for _, line := range strings.Split(s, "\n") {
		f := fields(line)
		if len(f) == 0 {
			continue
		}
		if !refDevice(f[0]) {
			return 0, false
		}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return 0, false
			}
			if k != "rbytes" && k != "wbytes" {
				continue
			}
			n, ok := refUint(v)
			if !ok {
				return 0, false
			}
			if sum, ok = refAdd(sum, n); !ok {
				return 0, false
			}
		}
	}
	return sum, true
}

func FuzzParseIOStat(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := parseIOStat(in)
		want, ok := refIOStat(string(in))
		agree(t, in, got, err, want, ok)
	})
}

func refBlkio(s string) (sum uint64, entries int, ok bool) {
	for _, line := range strings.Split(s, "\n") {
		f := fields(line)
		switch len(f) {
		case 0:
			continue
		case 2:
			if _, ok := refUint(f[1]); f[0] != "Total" || !ok {
				return 0, 0, false
			}
		case 3:
			v, ok := refUint(f[2])
			if !refDevice(f[0]) || !ok {
				return 0, 0, false
			}
			entries++
			if f[1] == "Read" || f[1] == "Write" {
				if sum, ok = refAdd(sum, v); !ok {
					return 0, 0, false
				}
			}
		default:
			return 0, 0, false
		}
	}
	return sum, entries, true
}

func FuzzParseBlkio(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		got, n, err := parseBlkio(in)
		want, wantN, ok := refBlkio(string(in))
		agree(t, in, got, err, want, ok)
		if ok && n != wantN {
			t.Fatalf("entries = %d, reference %d, input %q", n, wantN, in)
		}
	})
}

func refNetDev(s string) (uint64, bool) {
	lines := strings.Split(s, "\n")
	if len(lines) < 2 || !strings.Contains(lines[0], "|") || !strings.Contains(lines[1], "|") {
		return 0, false
	}
	var sum uint64
	for _, line := range lines[2:] {
		if len(fields(line)) == 0 {
			continue
		}
		name, rest, ok := strings.Cut(line, ":")
		name = strings.TrimLeft(name, " \t")
		if !ok || name == "" {
			return 0, false
		}
		f := fields(rest)
		if len(f) < netDevFields {
			return 0, false
		}
		var vals []uint64
		for _, s := range f {
			v, ok := refUint(s)
			if !ok {
				return 0, false
			}
			vals = append(vals, v)
		}
		if name == "lo" {
			continue
		}
		if sum, ok = refAdd(sum, vals[0]); !ok {
			return 0, false
		}
		if sum, ok = refAdd(sum, vals[8]); !ok {
			return 0, false
		}
	}
	return sum, true
}

func FuzzParseNetDev(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := parseNetDev(in)
		want, ok := refNetDev(string(in))
		agree(t, in, got, err, want, ok)
	})
}

func FuzzParseProcCgroup(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		lines, err := parseProcCgroup(in)
		if err != nil {
			checkErr(t, in, err)
			return
		}
		if len(lines) == 0 {
			t.Fatal("no lines and no error")
		}
		for _, l := range lines {
			if !strings.HasPrefix(l.Path, "/") {
				t.Fatalf("relative path %q from %q", l.Path, in)
			}
			if l.ID != 0 && len(l.Controllers) == 0 {
				t.Fatalf("v1 line without controllers from %q", in)
			}
			if !strings.Contains(string(in), l.Path) {
				t.Fatalf("path %q not in the input %q", l.Path, in)
			}
		}
	})
}

func FuzzParseMountInfo(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		ms, err := parseMountInfo(in)
		if err != nil {
			checkErr(t, in, err)
			return
		}
		if n := len(fields(strings.ReplaceAll(string(in), "\n", " "))); len(ms) > 0 && n < 10*len(ms) {
			t.Fatalf("%d mounts from %d fields", len(ms), n)
		}
		for _, m := range ms {
			if m.FSType == "" || len(m.SuperOptions) == 0 {
				t.Fatalf("incomplete mount %+v from %q", m, in)
			}
		}
		// The layout must be derivable from any parsed mount table.
		_ = layoutFromMounts(ms, DefaultCgroupRoot)
	})
}

// FuzzParseContainerLogName checks that a kubelet log symlink name parses
// back to exactly itself, with names that hold no "_" and a hex ID.
func FuzzParseContainerLogName(f *testing.F) {
	f.Fuzz(func(t *testing.T, name string) {
		l, ok := parseContainerLogName(name)
		if !ok {
			return
		}
		if l.pod == "" || l.namespace == "" || l.container == "" || strings.ContainsRune(l.pod+l.namespace+l.container, '_') {
			t.Fatalf("%q: bad names %+v", name, l)
		}
		if len(l.id) < 12 || !isHex(l.id) || strings.ToLower(l.id) != l.id {
			t.Fatalf("%q: bad ID %q", name, l.id)
		}
		back := l.pod + "_" + l.namespace + "_" + l.container + "-" + l.id + ".log"
		if !strings.EqualFold(back, name) {
			t.Fatalf("%q parsed as %+v, which writes %q", name, l, back)
		}
	})
}

// FuzzParseMemTotal checks parseMemTotal against a strings reference: the
// first line whose first field is "MemTotal:" decides.
func FuzzParseMemTotal(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := parseMemTotal(in)
		var want uint64
		ok := false
		for _, line := range strings.Split(string(in), "\n") {
			fs := fields(line)
			if len(fs) == 0 || fs[0] != "MemTotal:" {
				continue
			}
			if len(fs) == 3 && fs[2] == "kB" {
				if v, vok := refUint(fs[1]); vok && v > 0 && v <= ^uint64(0)>>10 {
					want, ok = v<<10, true
				}
			}
			break
		}
		agree(t, in, got, err, want, ok)
	})
}
