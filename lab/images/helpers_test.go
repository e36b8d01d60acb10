package images

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// envRequireNode, set to 1 (as on the lab node's CI), turns the skips of
// tests that need root or containerd into failures.
const envRequireNode = "AMF_REQUIRE_NODE"

// workDir holds what the tests share: the binaries and the archive cache
// built once (TestMain removes it).
var workDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "amf-images-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// fixture is the one cold Build every test reads.
type fixture struct {
	binDir, cacheDir string
	images           []Image
	goBuild, cold    time.Duration
}

var buildOnce = sync.OnceValues(func() (fixture, error) {
	f := fixture{binDir: filepath.Join(workDir, "bin"), cacheDir: filepath.Join(workDir, "cache")}
	t0 := time.Now()
	if err := Binaries(context.Background(), Options{}, f.binDir); err != nil {
		return f, err
	}
	f.goBuild = time.Since(t0)
	t0 = time.Now()
	imgs, err := Build(context.Background(), Options{CacheDir: f.cacheDir, BinDir: f.binDir})
	f.cold = time.Since(t0)
	f.images = imgs
	return f, err
})

// built returns the shared build, skipping under -short (it builds four
// Go programs and compresses ~100 MB).
func built(t *testing.T) fixture {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binaries and every image")
	}
	f, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f fixture) image(t *testing.T, name string) Image {
	t.Helper()
	for _, img := range f.images {
		if img.Name == name {
			return img
		}
	}
	t.Fatalf("Build returned no image %s", name)
	return Image{}
}

// needRoot skips (or fails, with AMF_REQUIRE_NODE=1) a test that needs root.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "needs root to %s", why)
	}
}

func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv(envRequireNode) == "1" {
		t.Fatalf(format+" ("+envRequireNode+"=1)", args...)
	}
	t.Skipf(format, args...)
}

// openArchive unpacks an OCI archive into a temp folder and returns its one
// image and index.json's descriptor of it, read with go-containerregistry's
// layout package: a reader other than the writer.
func openArchive(t *testing.T, archive string) (v1.Image, v1.Descriptor) {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		p := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: entry %s of type %c in an OCI archive", archive, h.Name, h.Typeflag)
		}
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatalf("%s is not an OCI layout: %v", archive, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%s: index.json has %d manifests, want 1", archive, len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img, im.Manifests[0]
}

// file is one entry of an image's file system, as the tests see it.
type file struct {
	typ      byte
	mode     int64
	uid, gid int
	link     string
	data     []byte
}

// layerFiles reads every layer of img into a map by absolute path.
func layerFiles(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]file{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(h.Name, ".wh.") {
				t.Fatalf("whiteout %s in a FROM-scratch image", h.Name)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files["/"+strings.TrimSuffix(h.Name, "/")] = file{h.Typeflag, h.Mode, h.Uid, h.Gid, h.Linkname, b}
		}
		rc.Close()
	}
	return files
}

// rootfs writes img's file system into a temp folder with its modes and
// owners (as root), as containerd's snapshotter would.
func rootfs(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	files := layerFiles(t, img)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	// Folders before what they hold.
	sort.Strings(paths)
	for _, p := range paths {
		f := files[p]
		dst := filepath.Join(dir, p)
		switch f.typ {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.WriteFile(dst, f.data, 0o600); err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(f.link, dst); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: unexpected type %c", p, f.typ)
		}
		if err := os.Lchown(dst, f.uid, f.gid); err != nil {
			t.Fatal(err)
		}
		if f.typ != tar.TypeSymlink {
			if err := os.Chmod(dst, os.FileMode(f.mode)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// inRoot is a command run chrooted into root as uid:gid, as a container
// would run it (same kernel, its own file system).
func inRoot(ctx context.Context, root string, uid, gid uint32, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, args[0], args[1:]...)
	c.Dir = "/"
	c.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	c.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	return c
}
