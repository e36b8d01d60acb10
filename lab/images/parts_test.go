package images

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestTreeRejectsConflicts(t *testing.T) {
	for _, tc := range []struct {
		name    string
		build   func(*tree) error
		wantErr string
	}{
		{"same file twice, same contents", func(tr *tree) error {
			if err := tr.file("/a/b", 0o644, 0, 0, []byte("x")); err != nil {
				return err
			}
			return tr.file("/a/b", 0o644, 0, 0, []byte("x"))
		}, ""},
		{"same path, other contents", func(tr *tree) error {
			if err := tr.file("/a/b", 0o644, 0, 0, []byte("x")); err != nil {
				return err
			}
			return tr.file("/a/b", 0o644, 0, 0, []byte("y"))
		}, "added twice"},
		{"file under a symlink", func(tr *tree) error {
			if err := tr.symlink("/lib", "usr/lib"); err != nil {
				return err
			}
			return tr.file("/lib/x.so", 0o644, 0, 0, nil)
		}, "not a folder"},
		{"relative path", func(tr *tree) error { return tr.file("etc/passwd", 0o644, 0, 0, nil) }, "not absolute"},
		{"dir sets a parent's owner", func(tr *tree) error {
			if err := tr.file("/m/c/f", 0o644, 1, 1, nil); err != nil {
				return err
			}
			return tr.dir("/m/c", 0o750, 1883, 1883)
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.build(newTree())
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestHostFileKeepsSymlinks copies a file reached through a folder symlink
// and a file symlink, as /lib -> usr/lib and libfoo.so.1 -> libfoo.so.1.2.
func TestHostFileKeepsSymlinks(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "usr", "lib")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(real, "libfoo.so.1.2"), []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, os.Symlink("usr/lib", filepath.Join(root, "lib")))
	must(t, os.Symlink("libfoo.so.1.2", filepath.Join(real, "libfoo.so.1")))

	tr := newTree()
	must(t, tr.hostFile(filepath.Join(root, "lib", "libfoo.so.1")))
	got := map[string]string{}
	for _, e := range tr.sorted() {
		rel := strings.TrimPrefix(e.Path, root)
		switch {
		case e.Link != "":
			got[rel] = "-> " + e.Link
		case e.data != nil:
			got[rel] = string(e.data)
		}
	}
	want := map[string]string{"/lib": "-> usr/lib", "/usr/lib/libfoo.so.1": "-> libfoo.so.1.2", "/usr/lib/libfoo.so.1.2": "elf"}
	if len(got) != len(want) {
		t.Fatalf("tree %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}

// TestSharedLibrariesMatchLdd resolves the installed broker's closure and
// compares it with what the host's loader resolves (ldd), an independent
// oracle.
func TestSharedLibrariesMatchLdd(t *testing.T) {
	if _, err := os.Stat(DefaultMosquitto); err != nil {
		skipOrFail(t, "needs Debian's mosquitto (make deps): %v", err)
	}
	ldd, err := exec.LookPath("ldd")
	if err != nil {
		t.Skip("no ldd to compare with")
	}
	deps, err := sharedLibraries(DefaultMosquitto)
	if err != nil {
		t.Fatal(err)
	}
	if deps.Arch != runtime.GOARCH {
		t.Errorf("arch %s, want %s", deps.Arch, runtime.GOARCH)
	}
	out, err := exec.Command(ldd, DefaultMosquitto).Output()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	var interp string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 4 && f[1] == "=>":
			want = append(want, f[2])
		case len(f) == 2 && strings.HasPrefix(f[0], "/"):
			interp = f[0]
		}
	}
	got := slices.Clone(deps.Libs)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("closure\n%v\nldd\n%v", got, want)
	}
	if deps.Interp != interp {
		t.Errorf("loader %q, ldd %q", deps.Interp, interp)
	}
	if !slices.Contains(got, "/lib/x86_64-linux-gnu/libc.so.6") && runtime.GOARCH == "amd64" {
		t.Errorf("closure %v lacks libc", got)
	}
}

func TestSharedLibrariesErrors(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "script")
	must(t, os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755))
	for _, tc := range []struct{ name, bin, want string }{
		{"missing", filepath.Join(dir, "none"), "no such file"},
		{"not ELF", notELF, "read ELF headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := sharedLibraries(tc.bin); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestUpstreamVersion(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"2.0.11-1.2+deb12u2", "2.0.11"},
		{"1:2.0.11-1", "2.0.11"},
		{"2.0.11", "2.0.11"},
		{"2.0.18-1+b1", "2.0.18"},
	} {
		if got := upstreamVersion(tc.in); got != tc.want {
			t.Errorf("upstreamVersion(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDpkgOwner(t *testing.T) {
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "info"), 0o755))
	status := "Package: libmosquitto1\nStatus: install ok installed\nVersion: 9\nArchitecture: amd64\n\n" +
		"Package: mosquitto\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.0.11-1.2+deb12u2\nDescription: broker\n continued: line\n\n" +
		"Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n"
	must(t, os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "info", "mosquitto.list"), []byte("/.\n/usr\n/usr/sbin/mosquitto\n"), 0o644))
	for _, tc := range []struct {
		name, pkg, file, wantVersion, wantErr string
	}{
		{"owned", "mosquitto", "/usr/sbin/mosquitto", "2.0.11-1.2+deb12u2", ""},
		{"not its file", "mosquitto", "/usr/local/sbin/mosquitto", "", "is not a file of Debian's package mosquitto"},
		{"removed package", "gone", "/x", "", "not installed"},
		{"unknown package", "nope", "/x", "", "not installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := dpkgOwner(dir, tc.pkg, tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || p.Version != tc.wantVersion || p.Arch != "amd64" {
				t.Fatalf("%+v, %v; want version %s", p, err, tc.wantVersion)
			}
		})
	}
}

func TestCheckedImages(t *testing.T) {
	out := `REF              TYPE                                       DIGEST                                                                  STATUS         SIZE                UNPACKED 
amf.lab/pause:v1 application/vnd.oci.image.manifest.v1+json sha256:dee31b656b014c8c89f3a6ccb4b746874bcc9816783a78c00b2305e225fff2bd complete (2/2) 793.4 KiB/793.4 KiB true
amf.lab/x:v1     application/vnd.oci.image.manifest.v1+json sha256:00                                                               incomplete (1/2) 1 KiB/2 KiB       false
`
	got := checkedImages([]byte(out))
	if c := got["amf.lab/pause:v1"]; !c.complete || !c.unpacked || !strings.HasPrefix(c.digest, "sha256:dee3") {
		t.Errorf("pause: %+v", c)
	}
	if c := got["amf.lab/x:v1"]; c.complete || c.unpacked {
		t.Errorf("x: %+v", c)
	}
	if _, ok := got["REF"]; ok || len(got) != 2 {
		t.Errorf("parsed %v", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
