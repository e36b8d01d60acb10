package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestBuildReturnsEveryImageInOrder also logs the build's figures.
func TestBuildReturnsEveryImageInOrder(t *testing.T) {
	f := built(t)
	t.Logf("go build %v, cold Build (binaries given) %v", f.goBuild.Round(time.Millisecond), f.cold.Round(time.Millisecond))
	var names []string
	for _, img := range f.images {
		names = append(names, img.Name)
		t.Logf("%-36s %s %6.2f MiB %s", img.Ref, img.Digest, float64(img.Size)/(1<<20), filepath.Base(img.Archive))
		if filepath.Dir(img.Archive) != f.cacheDir {
			t.Errorf("%s: archive %s is not in the cache folder %s", img.Name, img.Archive, f.cacheDir)
		}
	}
	if want := []string{Pause, Mosquitto, Sidecar, Agent, Lab}; !slices.Equal(names, want) {
		t.Errorf("images %v, want %v", names, want)
	}
}

func TestImageConfigs(t *testing.T) {
	f := built(t)
	for _, tc := range []struct {
		name       string
		ref        string
		entrypoint []string
		cmd        []string
		user       string
	}{
		{Pause, "amf.lab/pause:v1", []string{"/pause"}, nil, "65535:65535"},
		{Mosquitto, "amf.lab/mosquitto:2.0.11-debian", []string{"/usr/sbin/mosquitto"}, []string{"-c", "/mosquitto/config/mosquitto.conf"}, "1883:1883"},
		{Sidecar, "ghcr.io/amf-edge/amf-sidecar:v0.1.0", []string{"/amf-sidecar"}, nil, "65532:65532"},
		{Agent, "ghcr.io/amf-edge/amf-agent:v0.1.0", []string{"/amf-agent"}, nil, "65532:65532"},
		{Lab, "amf.lab/amf-lab:v1", []string{"/amf-lab"}, nil, "65532:65532"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			built := f.image(t, tc.name)
			if built.Ref != tc.ref {
				t.Errorf("ref %s, want %s", built.Ref, tc.ref)
			}
			img, desc := openArchive(t, built.Archive)
			for _, a := range []string{ContainerdNameAnnotation, RefNameAnnotation} {
				if got := desc.Annotations[a]; got != tc.ref {
					t.Errorf("index.json annotation %s = %q, want %q", a, got, tc.ref)
				}
			}
			if desc.Digest != built.Digest {
				t.Errorf("index.json names %s, Build returned %s", desc.Digest, built.Digest)
			}
			if desc.MediaType != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s, want OCI", desc.MediaType)
			}
			if p := desc.Platform; p == nil || p.OS != "linux" || p.Architecture != runtime.GOARCH {
				t.Errorf("descriptor platform %+v, want linux/%s", p, runtime.GOARCH)
			}
			if fi, err := os.Stat(built.Archive); err != nil || fi.Size() != built.Size || fi.Mode().Perm() != 0o644 {
				t.Errorf("archive: %v, size/mode want %d/0644", err, built.Size)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
				t.Errorf("config platform %s/%s", cf.OS, cf.Architecture)
			}
			if !cf.Created.Time.Equal(time.Unix(0, 0)) {
				t.Errorf("created %v, want the epoch (reproducible digests)", cf.Created)
			}
			c := cf.Config
			if !slices.Equal(c.Entrypoint, tc.entrypoint) || !slices.Equal(c.Cmd, tc.cmd) || c.User != tc.user {
				t.Errorf("entrypoint %q cmd %q user %q, want %q %q %q", c.Entrypoint, c.Cmd, c.User, tc.entrypoint, tc.cmd, tc.user)
			}
		})
	}
}

// TestMosquittoImageSaysWhereItCameFrom: labels, and the eclipse image's
// port and volumes.
func TestMosquittoImageSaysWhereItCameFrom(t *testing.T) {
	f := built(t)
	img, _ := openArchive(t, f.image(t, Mosquitto).Archive)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	from := cf.Config.Labels["amf.lab.built-from"]
	t.Logf("amf.lab.built-from: %s", from)
	for _, want := range []string{"Debian packages mosquitto and mosquitto-clients 2.0.11-", "/usr/sbin/mosquitto", MosquittoSub, "shared libraries", LabBinary} {
		if !strings.Contains(from, want) {
			t.Errorf("label amf.lab.built-from %q lacks %q", from, want)
		}
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; !strings.HasPrefix(v, "2.0.11-") {
		t.Errorf("version label %q", v)
	}
	if _, ok := cf.Config.ExposedPorts["1883/tcp"]; !ok {
		t.Errorf("ports %v lack 1883/tcp", cf.Config.ExposedPorts)
	}
	for _, v := range []string{"/mosquitto/data", "/mosquitto/log"} {
		if _, ok := cf.Config.Volumes[v]; !ok {
			t.Errorf("volumes %v lack %s", cf.Config.Volumes, v)
		}
	}
}

func TestImageFiles(t *testing.T) {
	f := built(t)
	reg := func(mode int64, uid int) file { return file{typ: tar.TypeReg, mode: mode, uid: uid, gid: uid} }
	dir := func(uid int) file { return file{typ: tar.TypeDir, mode: 0o755, uid: uid, gid: uid} }
	for _, tc := range []struct {
		name string
		want map[string]file
		only bool // nothing else in the image
	}{
		{Pause, map[string]file{"/pause": reg(0o755, 0)}, true},
		{Sidecar, map[string]file{"/amf-sidecar": reg(0o755, 65532)}, true},
		{Agent, map[string]file{"/amf-agent": reg(0o755, 65532)}, true},
		{Lab, map[string]file{"/amf-lab": reg(0o755, 65532)}, true},
		{Mosquitto, map[string]file{
			"/usr/sbin/mosquitto":              reg(0o755, 0),
			"/usr/local/bin/amf-lab":           reg(0o755, 0),
			"/etc/passwd":                      reg(0o644, 0),
			"/etc/group":                       reg(0o644, 0),
			"/mosquitto":                       dir(1883),
			"/mosquitto/config":                dir(1883),
			"/mosquitto/data":                  dir(1883),
			"/mosquitto/log":                   dir(1883),
			"/mosquitto/config/mosquitto.conf": reg(0o644, 1883),
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, _ := openArchive(t, f.image(t, tc.name).Archive)
			files := layerFiles(t, img)
			for p, w := range tc.want {
				g, ok := files[p]
				if !ok {
					t.Errorf("%s missing", p)
					continue
				}
				if g.typ != w.typ || g.mode != w.mode || g.uid != w.uid || g.gid != w.gid {
					t.Errorf("%s: type %c mode %o owner %d:%d, want %c %o %d:%d", p, g.typ, g.mode, g.uid, g.gid, w.typ, w.mode, w.uid, w.gid)
				}
			}
			if tc.only && len(files) != len(tc.want) {
				t.Errorf("%d files, want only %v", len(files), tc.want)
			}
			for _, sh := range []string{"/bin/sh", "/usr/bin/sh", "/bin/bash", "/usr/bin/bash"} {
				if _, ok := files[sh]; ok {
					t.Errorf("image has a shell at %s", sh)
				}
			}
		})
	}
}

// TestProgramsAreStatic: what runs in a FROM-scratch image (or next to
// Debian's libraries it was not built against) must need no loader.
func TestProgramsAreStatic(t *testing.T) {
	f := built(t)
	for _, tc := range []struct{ image, path string }{
		{Pause, "/pause"},
		{Sidecar, "/amf-sidecar"},
		{Agent, "/amf-agent"},
		{Lab, "/amf-lab"},
		{Mosquitto, LabBinary},
	} {
		t.Run(tc.image+tc.path, func(t *testing.T) {
			img, _ := openArchive(t, f.image(t, tc.image).Archive)
			ef, err := elf.NewFile(bytes.NewReader(layerFiles(t, img)[tc.path].data))
			if err != nil {
				t.Fatalf("%s is not ELF: %v", tc.path, err)
			}
			if goarch, _, _ := elfArch(ef.Machine); goarch != runtime.GOARCH {
				t.Errorf("%s is for %v, want %s", tc.path, ef.Machine, runtime.GOARCH)
			}
			if ef.Section(".interp") != nil {
				t.Errorf("%s is dynamically linked", tc.path)
			}
		})
	}
}

func TestMosquittoImageUsers(t *testing.T) {
	f := built(t)
	img, _ := openArchive(t, f.image(t, Mosquitto).Archive)
	files := layerFiles(t, img)
	for _, tc := range []struct{ path, line string }{
		{"/etc/passwd", "mosquitto:x:1883:1883:"},
		{"/etc/passwd", "nobody:x:65534:65534:"},
		{"/etc/group", "mosquitto:x:1883:"},
		{"/mosquitto/config/mosquitto.conf", "listener 1883"},
		{"/mosquitto/config/mosquitto.conf", "allow_anonymous true"},
	} {
		if !slices.ContainsFunc(strings.Split(string(files[tc.path].data), "\n"), func(l string) bool { return strings.HasPrefix(l, tc.line) }) {
			t.Errorf("%s has no line %q:\n%s", tc.path, tc.line, files[tc.path].data)
		}
	}
}

// TestMosquittoRunsInItsImage runs the image's broker chrooted into its
// extracted file system: it must find every library and the users.
func TestMosquittoRunsInItsImage(t *testing.T) {
	f := built(t)
	needRoot(t, "chroot into the image's file system")
	img, _ := openArchive(t, f.image(t, Mosquitto).Archive)
	root := rootfs(t, img)

	t.Run("-h loads every library", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := inRoot(ctx, root, MosquittoUser, MosquittoUser, MosquittoBinary, "-h").CombinedOutput()
		// mosquitto -h exits 3 after its usage; a missing library exits 127.
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 || !bytes.HasPrefix(out, []byte("mosquitto version 2.0.11")) {
			t.Fatalf("mosquitto -h: %v\n%s", err, out)
		}
	})

	for _, tc := range []struct {
		name    string
		uid     uint32
		wantUID string // the broker's uid once it serves
	}{
		{"serves MQTT as the image's user 1883", MosquittoUser, "1883"},
		{"started as root it drops to user mosquitto from /etc/passwd", 0, "1883"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			conf := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\n", port)
			if err := os.WriteFile(filepath.Join(root, "mosquitto/config/test.conf"), []byte(conf), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c := inRoot(ctx, root, tc.uid, tc.uid, MosquittoBinary, "-c", "/mosquitto/config/test.conf")
			var log bytes.Buffer
			c.Stdout, c.Stderr = &log, &log
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				c.Process.Kill()
				c.Wait()
				if t.Failed() {
					t.Logf("mosquitto's output:\n%s", log.String())
				}
			}()
			if err := mqttConnect(ctx, fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
				t.Fatal(err)
			}
			if uid := procUID(t, c.Process.Pid); uid != tc.wantUID {
				t.Errorf("broker runs as uid %s, want %s", uid, tc.wantUID)
			}
			// The exec liveness probe users of the eclipse image write: the
			// broker's retained $SYS version comes back at once.
			out, err := inRoot(ctx, root, tc.uid, tc.uid, MosquittoSub, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-t", "$SYS/#", "-C", "1", "-W", "3").CombinedOutput()
			if err != nil || !bytes.HasPrefix(out, []byte("mosquitto version 2.0.11")) {
				t.Errorf("mosquitto_sub in the image: %v\n%s", err, out)
			}
		})
	}
}

// TestLabBinaryRunsInItsImages runs amf-lab's fault injector as the broker
// container would exec it, and as the amf-lab image's entrypoint.
func TestLabBinaryRunsInItsImages(t *testing.T) {
	f := built(t)
	needRoot(t, "chroot into the images' file systems")
	for _, tc := range []struct {
		image, path string
		uid         uint32
	}{
		{Mosquitto, LabBinary, MosquittoUser},
		{Lab, "/amf-lab", 65532},
	} {
		t.Run(tc.image, func(t *testing.T) {
			img, _ := openArchive(t, f.image(t, tc.image).Archive)
			root := rootfs(t, img)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := inRoot(ctx, root, tc.uid, tc.uid, tc.path, "stress", "--profile", "50ms").CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte(`"event":"done"`)) {
				t.Fatalf("%s stress: %v\n%s", tc.path, err, out)
			}
		})
	}
}

// TestRefsAreTheManifests: the project's images must carry the refs that
// manifests/ deploy, or the node would try to pull them.
func TestRefsAreTheManifests(t *testing.T) {
	f := built(t)
	want := map[string]bool{}
	root := filepath.Join("..", "..", "manifests")
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if ref, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "image: "); ok && strings.Contains(ref, "/amf-") {
				want[ref] = true
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatalf("no amf image in %s", root)
	}
	for ref := range want {
		if !slices.ContainsFunc(f.images, func(img Image) bool { return img.Ref == ref }) {
			t.Errorf("manifests/ deploy %s, which Build does not make", ref)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// mqttConnect dials addr until it answers an MQTT 3.1.1 CONNECT with an
// accepting CONNACK, or ctx ends.
func mqttConnect(ctx context.Context, addr string) error {
	connect := []byte{0x10, 16, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, 4, 't', 'e', 's', 't'}
	var last error
	for ctx.Err() == nil {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			last = err
			time.Sleep(50 * time.Millisecond)
			continue
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Write(connect)
		ack := make([]byte, 4)
		if err == nil {
			_, err = io.ReadFull(conn, ack)
		}
		conn.Close()
		if err != nil {
			return fmt.Errorf("MQTT CONNECT to %s: %w", addr, err)
		}
		if !bytes.Equal(ack, []byte{0x20, 2, 0, 0}) {
			return fmt.Errorf("MQTT CONNECT to %s: CONNACK % x, want 20 02 00 00", addr, ack)
		}
		return nil
	}
	return fmt.Errorf("no MQTT broker at %s: %v (%w)", addr, last, ctx.Err())
}

// procUID is the real uid of process pid.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return ""
}
