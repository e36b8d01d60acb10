package cgroup

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// wantSyntaxErr checks that err is a *SyntaxError on the given line whose
// message contains sub.
func wantSyntaxErr(t *testing.T, err error, line int, sub string) {
	t.Helper()
	var se *SyntaxError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *SyntaxError", err)
	}
	if se.Line != line {
		t.Errorf("error line = %d, want %d (%v)", se.Line, line, err)
	}
	if !strings.Contains(se.Msg, sub) {
		t.Errorf("error %q does not contain %q", se.Msg, sub)
	}
}

func TestParseUintFile(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uint64
		line int // 0: no error
		err  string
	}{
		{name: "number and newline", in: "123456789\n", want: 123456789},
		{name: "no newline", in: "42", want: 42},
		{name: "zero", in: "0\n", want: 0},
		{name: "max uint64", in: "18446744073709551615\n", want: 18446744073709551615},
		{name: "overflow is an error", in: "18446744073709551616\n", line: 1, err: "not an unsigned number"},
		{name: "empty is an error", in: "", line: 1, err: "empty"},
		{name: "blank is an error", in: " \n", line: 1, err: "empty"},
		{name: "only newline is an error", in: "\n", line: 1, err: "empty"},
		{name: "negative is an error", in: "-1\n", line: 1, err: "not an unsigned number"},
		{name: "two numbers is an error", in: "1 2\n", line: 1, err: "trailing"},
		{name: "second line is an error", in: "1\n2\n", line: 2, err: "single line"},
		{name: "max is an error for v1 files", in: "max\n", line: 1, err: "not an unsigned number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseUintFile([]byte(tc.in))
			if tc.line > 0 {
				wantSyntaxErr(t, err, tc.line, tc.err)
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	tests := []struct {
		name  string
		parse func([]byte) (uint64, error)
		in    string
		want  uint64
		isErr bool
	}{
		{name: "v2 max means unlimited", parse: parseMemoryMax, in: "max\n", want: 0},
		{name: "v2 number", parse: parseMemoryMax, in: "104857600\n", want: 104857600},
		{name: "v2 max with junk is an error", parse: parseMemoryMax, in: "max 1\n", isErr: true},
		{name: "v2 garbage is an error", parse: parseMemoryMax, in: "maximum\n", isErr: true},
		{name: "v1 4KiB-page no-limit value means unlimited", parse: parseV1Limit, in: "9223372036854771712\n", want: 0},
		{name: "v1 64KiB-page no-limit value means unlimited", parse: parseV1Limit, in: "9223372036854710272\n", want: 0},
		{name: "v1 real limit", parse: parseV1Limit, in: "67108864\n", want: 64 << 20},
		{name: "v1 limit just below the cut", parse: parseV1Limit, in: "4611686018427387903\n", want: 1<<62 - 1},
		{name: "v1 garbage is an error", parse: parseV1Limit, in: "-1\n", isErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.parse([]byte(tc.in))
			if tc.isErr {
				if err == nil {
					t.Fatalf("got %d, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestParseCPUStat(t *testing.T) {
	const full = "usage_usec 123456789\nuser_usec 100000000\nsystem_usec 23456789\ncore_sched.force_idle_usec 0\nnr_periods 5120\nnr_throttled 37\nthrottled_usec 1843200\nnr_bursts 0\nburst_usec 0\n"
	tests := []struct {
		name string
		in   string
		want uint64
		line int
		err  string
	}{
		{name: "kernel 6 file", in: full, want: 123456789},
		{name: "without cpu controller only three lines", in: "usage_usec 5\nuser_usec 3\nsystem_usec 2\n", want: 5},
		{name: "usage not first", in: "user_usec 3\nusage_usec 7\n", want: 7},
		{name: "missing usage is an error", in: "user_usec 3\nsystem_usec 2\n", line: 0, err: "no usage_usec"},
		{name: "empty is an error", in: "", line: 0, err: "no usage_usec"},
		{name: "bad number names the line", in: "user_usec 3\nusage_usec 12a\n", line: 2, err: "not an unsigned number"},
		{name: "bad number in another key is an error", in: "usage_usec 1\nnr_periods x\n", line: 2, err: "not an unsigned number"},
		{name: "key without value is an error", in: "usage_usec\n", line: 1, err: "key value"},
		{name: "three fields is an error", in: "usage_usec 1 2\n", line: 1, err: "key value"},
		{name: "repeated usage is an error", in: "usage_usec 1\nusage_usec 2\n", line: 2, err: "repeated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCPUStat([]byte(tc.in))
			if tc.err != "" {
				wantSyntaxErr(t, err, tc.line, tc.err)
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestParseIOStat(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uint64
		line int
		err  string
	}{
		{name: "no io yet is zero", in: "", want: 0},
		{name: "one device", in: "8:0 rbytes=100 wbytes=20 rios=1 wios=1 dbytes=0 dios=0\n", want: 120},
		{name: "sums several devices", in: "259:0 rbytes=1048576 wbytes=2097152 rios=10 wios=20 dbytes=0 dios=0\n8:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n253:1 rbytes=100 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n", want: 3158116},
		{name: "ignores discard bytes", in: "8:0 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=1000 dios=1\n", want: 3},
		{name: "tolerates io.latency and io.cost keys", in: "8:0 rbytes=1 wbytes=2 rios=1 wios=1 dbytes=0 dios=0 depth=max avg_lat=0 win=0 cost.vrate=100.00 cost.usage=5\n", want: 3},
		{name: "device without stats counts zero", in: "8:0\n8:16 rbytes=5 wbytes=5\n", want: 10},
		{name: "bad device names the line", in: "8:0 rbytes=1 wbytes=1\nsda rbytes=1\n", line: 2, err: "MAJ:MIN"},
		{name: "bad rbytes is an error", in: "8:0 rbytes=x wbytes=1\n", line: 1, err: "rbytes"},
		{name: "empty wbytes is an error", in: "8:0 rbytes=1 wbytes=\n", line: 1, err: "wbytes"},
		{name: "token without = is an error", in: "8:0 rbytes 1\n", line: 1, err: "key=value"},
		{name: "sum overflow is an error", in: "8:0 rbytes=18446744073709551615 wbytes=1\n", line: 1, err: "overflow"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseIOStat([]byte(tc.in))
			if tc.err != "" {
				wantSyntaxErr(t, err, tc.line, tc.err)
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestParseBlkio(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    uint64
		entries int
		line    int
		err     string
	}{
		{name: "only total means no entries", in: "Total 0\n", want: 0, entries: 0},
		{name: "empty file means no entries", in: "", want: 0, entries: 0},
		{name: "read plus write of one device", in: "8:0 Read 100\n8:0 Write 20\n8:0 Sync 20\n8:0 Async 100\n8:0 Discard 0\n8:0 Total 120\nTotal 120\n", want: 120, entries: 6},
		{name: "sums devices", in: "8:0 Read 1\n8:0 Write 2\n8:0 Total 3\n254:0 Read 10\n254:0 Write 20\n254:0 Total 30\nTotal 33\n", want: 33, entries: 6},
		{name: "old kernel without discard", in: "8:0 Read 5\n8:0 Write 5\n8:0 Sync 0\n8:0 Async 10\n8:0 Total 10\nTotal 10\n", want: 10, entries: 5},
		{name: "zero counts are entries", in: "8:0 Read 0\n8:0 Write 0\n8:0 Total 0\nTotal 0\n", want: 0, entries: 3},
		{name: "bad value names the line", in: "8:0 Read 1\n8:0 Write x\n", line: 2, err: "not an unsigned number"},
		{name: "bad device is an error", in: "sda Read 1\n", line: 1, err: "MAJ:MIN"},
		{name: "two fields not total is an error", in: "8:0 Read\n", line: 1, err: "Total value"},
		{name: "bad total is an error", in: "Total -\n", line: 1, err: "Total"},
		{name: "four fields is an error", in: "8:0 Read 1 2\n", line: 1, err: "MAJ:MIN Op value"},
		{name: "one field is an error", in: "8:0\n", line: 1, err: "MAJ:MIN Op value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, n, err := parseBlkio([]byte(tc.in))
			if tc.err != "" {
				wantSyntaxErr(t, err, tc.line, tc.err)
				return
			}
			if err != nil || got != tc.want || n != tc.entries {
				t.Fatalf("got %d (%d entries), %v; want %d (%d entries)", got, n, err, tc.want, tc.entries)
			}
		})
	}
}

const netDevHeader = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"

func TestParseNetDev(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want uint64
		line int
		err  string
	}{
		{name: "skips lo and sums rx and tx", in: netDevHeader +
			"    lo:  123456     789    0    0    0     0          0         0   123456     789    0    0    0     0       0          0\n" +
			"  eth0: 98765432   65432    0    3    0     0          0         0  1234567    9876    0    0    0     0       0          0\n",
			want: 98765432 + 1234567},
		{name: "several interfaces", in: netDevHeader +
			"  eth0: 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n" +
			"  eth1: 100 1 0 0 0 0 0 0 200 2 0 0 0 0 0 0\n", want: 330},
		{name: "long name with no space after the colon", in: netDevHeader +
			"vethabcdef0123:7 1 0 0 0 0 0 0 8 2 0 0 0 0 0 0\n", want: 15},
		{name: "only lo is zero", in: netDevHeader + "    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0\n", want: 0},
		{name: "header only is zero", in: netDevHeader, want: 0},
		{name: "empty is an error", in: "", line: 0, err: "header"},
		{name: "missing header is an error", in: "  eth0: 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n  eth1: 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n", line: 1, err: "header"},
		{name: "short line names it", in: netDevHeader + "  eth0: 10 1 0 0 0 0 0 0 20\n", line: 3, err: "9 counters"},
		{name: "bad counter names it", in: netDevHeader + "  eth0: 10 1 0 0 0 0 0 0 2x 2 0 0 0 0 0 0\n", line: 3, err: "counter 9"},
		{name: "missing colon is an error", in: netDevHeader + "  eth0 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n", line: 3, err: "iface"},
		{name: "missing name is an error", in: netDevHeader + "  : 10 1 0 0 0 0 0 0 20 2 0 0 0 0 0 0\n", line: 3, err: "iface"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseNetDev([]byte(tc.in))
			if tc.err != "" {
				wantSyntaxErr(t, err, tc.line, tc.err)
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestParseProcCgroup(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []procCgroup
		line int
		err  string
	}{
		{name: "v2 only", in: "0::/kubepods/burstable/pod1/abc\n", want: []procCgroup{{ID: 0, Path: "/kubepods/burstable/pod1/abc"}}},
		{name: "v1 with combined controllers, named hierarchy and hybrid line", in: "9:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n", want: []procCgroup{
			{ID: 9, Controllers: []string{"cpu", "cpuacct"}, Path: "/docker/abc"},
			{ID: 1, Controllers: []string{"name=systemd"}, Path: "/docker/abc"},
			{ID: 0, Path: "/"},
		}},
		{name: "path with colons", in: "0::/a:b:c\n", want: []procCgroup{{ID: 0, Path: "/a:b:c"}}},
		{name: "empty is an error", in: "", line: 0, err: "no cgroup lines"},
		{name: "one colon is an error", in: "0:/x\n", line: 1, err: "ID:controllers:path"},
		{name: "bad ID names the line", in: "0::/\nx:memory:/\n", line: 2, err: "hierarchy ID"},
		{name: "relative path is an error", in: "0::x\n", line: 1, err: "not absolute"},
		{name: "v1 line without controllers is an error", in: "4::/x\n", line: 1, err: "no controllers"},
		{name: "empty controller is an error", in: "4:cpu,:/x\n", line: 1, err: "empty controller"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcCgroup([]byte(tc.in))
			if tc.err != "" {
				wantSyntaxErr(t, err, tc.line, tc.err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b procCgroup) bool {
				return a.ID == b.ID && a.Path == b.Path && slices.Equal(a.Controllers, b.Controllers)
			}) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseMountInfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []mountInfo
		line int
		err  string
	}{
		{name: "v1 combined mount with optional fields", in: "34 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct\n",
			want: []mountInfo{{Root: "/", MountPoint: "/sys/fs/cgroup/cpu,cpuacct", FSType: "cgroup", Source: "cgroup", SuperOptions: []string{"rw", "cpu", "cpuacct"}}}},
		{name: "v2 without optional fields", in: "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
			want: []mountInfo{{Root: "/", MountPoint: "/sys/fs/cgroup/unified", FSType: "cgroup2", Source: "cgroup2", SuperOptions: []string{"rw"}}}},
		{name: "several optional fields and escaped space", in: "36 35 98:0 /mnt\\0401 /mnt2 rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue\n",
			want: []mountInfo{{Root: "/mnt 1", MountPoint: "/mnt2", FSType: "ext3", Source: "/dev/root", SuperOptions: []string{"rw", "errors=continue"}}}},
		{name: "container view of its own cgroup", in: "1200 1100 0:31 /kubepods/burstable/pod1/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
			want: []mountInfo{{Root: "/kubepods/burstable/pod1/abc", MountPoint: "/sys/fs/cgroup/memory", FSType: "cgroup", Source: "cgroup", SuperOptions: []string{"rw", "memory"}}}},
		{name: "empty is no mounts", in: "", want: nil},
		{name: "missing separator names the line", in: "40 30 0:37 / /x rw - cgroup2 cgroup2 rw\n41 30 0:37 / /y rw cgroup2 cgroup2 rw\n", line: 2, err: "fstype"},
		{name: "too few fields after separator", in: "40 30 0:37 / /x rw - cgroup2 cgroup2\n", line: 1, err: "fstype"},
		{name: "bad device is an error", in: "40 30 037 / /x rw - cgroup2 cgroup2 rw\n", line: 1, err: "MAJ:MIN"},
		{name: "bad ID is an error", in: "x 30 0:37 / /x rw - cgroup2 cgroup2 rw\n", line: 1, err: "mount ID"},
		{name: "truncated escape is an error", in: "40 30 0:37 /a\\04 /x rw - cgroup2 cgroup2 rw\n", line: 1, err: "escape"},
		{name: "non-octal escape is an error", in: "40 30 0:37 / /x\\09z rw - cgroup2 cgroup2 rw\n", line: 1, err: "escape"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMountInfo([]byte(tc.in))
			if tc.err != "" {
				wantSyntaxErr(t, err, tc.line, tc.err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b mountInfo) bool {
				return a.Root == b.Root && a.MountPoint == b.MountPoint && a.FSType == b.FSType && a.Source == b.Source && slices.Equal(a.SuperOptions, b.SuperOptions)
			}) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestSyntaxErrorNamesFileAndLine(t *testing.T) {
	_, err := parseIOStat([]byte("8:0 rbytes=1\n8:0 rbytes=x\n"))
	err = inFile("/sys/fs/cgroup/x/io.stat", err)
	if got, want := err.Error(), "/sys/fs/cgroup/x/io.stat: line 2: "; !strings.HasPrefix(got, want) {
		t.Fatalf("error %q does not start with %q", got, want)
	}
}
