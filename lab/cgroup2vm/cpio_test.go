package cgroup2vm

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// cpioEntry is one entry as readCPIO finds it.
type cpioEntry struct {
	mode         uint32
	rmaj, rmin   uint32
	data         string
	nlink, uid   uint32
	headerOffset int
}

// readCPIO parses a newc archive as the kernel's initramfs unpacker does:
// 110-byte headers of 8-digit hex fields, name and data each padded to 4
// bytes, up to TRAILER!!!.
func readCPIO(t *testing.T, b []byte) map[string]cpioEntry {
	t.Helper()
	out := map[string]cpioEntry{}
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("header at %d field %d: %v", off, i, err)
		}
		return uint32(v)
	}
	pad := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc header at offset %d", off)
		}
		e := cpioEntry{mode: field(1), uid: field(2), nlink: field(4), rmaj: field(9), rmin: field(10), headerOffset: off}
		size, nameSize := int(field(6)), int(field(11))
		name := string(b[off+110 : off+110+nameSize-1])
		if b[off+110+nameSize-1] != 0 {
			t.Fatalf("name %q not NUL-terminated", name)
		}
		dataOff := pad(off + 110 + nameSize)
		e.data = string(b[dataOff : dataOff+size])
		off = pad(dataOff + size)
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		if _, dup := out[name]; dup {
			t.Errorf("entry %s written twice", name)
		}
		out[name] = e
	}
}

func TestCPIOWriterWritesWhatTheKernelUnpacks(t *testing.T) {
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "v1", "cpu,cpuacct"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "v1", "cpu,cpuacct", "cpuacct.usage"), []byte("12345\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("cpu,cpuacct", filepath.Join(src, "v1", "cpuacct")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.charDev("dev/console", 5, 1)
	w.file("/amf/src/sidecar/x.test", 0o755, []byte("abc")) // 3 bytes: padded
	w.file("init", 0o755, []byte("\x7fELF"))
	if err := w.tree("amf/src/sidecar/testdata", src); err != nil {
		t.Fatal(err)
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	got := readCPIO(t, buf.Bytes())
	tests := []struct {
		name       string
		mode       uint32
		data       string
		rmaj, rmin uint32
	}{
		{name: "dev", mode: modeDir | 0o755},
		{name: "dev/console", mode: modeCharDev | 0o600, rmaj: 5, rmin: 1},
		{name: "amf", mode: modeDir | 0o755},
		{name: "amf/src/sidecar", mode: modeDir | 0o755},
		{name: "amf/src/sidecar/x.test", mode: modeFile | 0o755, data: "abc"},
		{name: "init", mode: modeFile | 0o755, data: "\x7fELF"},
		{name: "amf/src/sidecar/testdata/v1/cpu,cpuacct/cpuacct.usage", mode: modeFile | 0o644, data: "12345\n"},
		{name: "amf/src/sidecar/testdata/v1/cpuacct", mode: modeSymlink | 0o777, data: "cpu,cpuacct"},
	}
	for _, tc := range tests {
		e, ok := got[tc.name]
		if !ok {
			t.Errorf("no entry %s (have %d entries)", tc.name, len(got))
			continue
		}
		if e.mode != tc.mode || e.data != tc.data || e.rmaj != tc.rmaj || e.rmin != tc.rmin || e.uid != 0 {
			t.Errorf("%s: mode %o data %q dev %d:%d uid %d; want mode %o data %q dev %d:%d uid 0", tc.name, e.mode, e.data, e.rmaj, e.rmin, e.uid, tc.mode, tc.data, tc.rmaj, tc.rmin)
		}
	}
	// Parents come before their children, as the unpacker creates them in order.
	if got["amf/src"].headerOffset > got["amf/src/sidecar"].headerOffset || got["amf/src/sidecar"].headerOffset > got["amf/src/sidecar/x.test"].headerOffset {
		t.Error("a directory entry comes after an entry inside it")
	}
}

func TestCheckStaticRefusesWhatTheInitramfsCannotRun(t *testing.T) {
	tests := []struct {
		name string
		path func(t *testing.T) string
		err  string
	}{
		{name: "a dynamically linked program", path: func(t *testing.T) string {
			for _, p := range []string{"/bin/true", "/usr/bin/true"} {
				if _, err := os.Stat(p); err == nil {
					return p
				}
			}
			t.Skip("no /bin/true to try")
			return ""
		}, err: "dynamically linked"},
		{name: "not an ELF file", path: func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "script")
			if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		}, err: "check"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.path(t)
			if err := checkStatic(p); err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.err)) {
				t.Errorf("checkStatic(%s) = %v, want an error with %q", p, err, tc.err)
			}
		})
	}
}
