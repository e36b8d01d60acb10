package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"io"
	"path/filepath"
	"runtime"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestBuildLayout builds amf-sidecar for linux/amd64 and linux/arm64 (only the
// sidecar, to keep the test fast; amf-agent goes through the same code path)
// into an OCI layout and reads it back.
func TestBuildLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles binaries")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	out := t.TempDir()
	opts := Options{
		Out:       out,
		Registry:  "ghcr.io/amf-edge",
		Tag:       "v0.1.0",
		Commands:  []string{"amf-sidecar"},
		Arches:    []string{"amd64", "arm64"},
		ModuleDir: root,
	}
	res, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		for a, s := range r.Sizes {
			t.Logf("%s linux/%s: %d bytes", r.Ref, a, s)
		}
	}
	// A second run must replace, not duplicate, the index, and be reproducible.
	res2, err := Build(context.Background(), Options{
		Out: out, Registry: opts.Registry, Tag: opts.Tag, Commands: opts.Commands,
		Arches: opts.Arches, ModuleDir: root,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Digest != res2[0].Digest {
		t.Errorf("not reproducible: %s then %s", res[0].Digest, res2[0].Digest)
	}
	checkLayout(t, out, "amf-sidecar", "ghcr.io/amf-edge/amf-sidecar:v0.1.0")
}

func checkLayout(t *testing.T, dir, name, ref string) {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var found []v1.Descriptor
	for _, d := range im.Manifests {
		if d.Annotations[RefNameAnnotation] == ref {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("index.json: %d entries named %q, want 1 (%+v)", len(found), ref, im.Manifests)
	}
	if !found[0].MediaType.IsIndex() {
		t.Fatalf("%s: media type %s, want an image index", ref, found[0].MediaType)
	}
	idx, err := top.ImageIndex(found[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	seen := map[string]bool{}
	for _, d := range m.Manifests {
		if d.Platform == nil || d.Platform.OS != "linux" {
			t.Fatalf("manifest %s: platform %+v", d.Digest, d.Platform)
		}
		arch := d.Platform.Architecture
		mach, ok := want[arch]
		if !ok {
			t.Fatalf("unexpected platform linux/%s", arch)
		}
		seen[arch] = true
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, img, name, arch, mach)
	}
	for arch := range want {
		if !seen[arch] {
			t.Errorf("%s: platform linux/%s missing", ref, arch)
		}
	}
}

func checkImage(t *testing.T, img v1.Image, name, arch string, mach elf.Machine) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != arch {
		t.Errorf("%s: config platform %s/%s", arch, cf.OS, cf.Architecture)
	}
	if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != "/"+name {
		t.Errorf("%s: entrypoint %q", arch, got)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("%s: user %q, want 65532:65532", arch, cf.Config.User)
	}
	if cf.Config.WorkingDir != "/" {
		t.Errorf("%s: workdir %q", arch, cf.Config.WorkingDir)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%s: %d layers, want 1", arch, len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var files int
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files++
		if h.Name != name {
			t.Errorf("%s: unexpected file %q in layer (no shell, nothing else)", arch, h.Name)
			continue
		}
		if h.Typeflag != tar.TypeReg || h.Mode != 0o755 || h.Uid != NonRoot || h.Gid != NonRoot {
			t.Errorf("%s: /%s type %c mode %o owner %d:%d, want regular 0755 65532:65532",
				arch, name, h.Typeflag, h.Mode, h.Uid, h.Gid)
		}
		bin, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s: /%s is not ELF: %v", arch, name, err)
		}
		if f.Machine != mach || f.Class != elf.ELFCLASS64 {
			t.Errorf("%s: ELF machine %v class %v, want %v", arch, f.Machine, f.Class, mach)
		}
		if f.Section(".interp") != nil {
			t.Errorf("%s: binary is dynamically linked (has .interp)", arch)
		}
	}
	if files != 1 {
		t.Errorf("%s: %d files in layer, want 1", arch, files)
	}
}

// TestImageFromFakeBinary checks the image shape quickly without building.
func TestImageFromFakeBinary(t *testing.T) {
	img, err := Image("amf-agent", "arm64", []byte("not really a binary"))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.Entrypoint[0] != "/amf-agent" || cf.Config.User != "65532:65532" || cf.Architecture != "arm64" {
		t.Errorf("config %+v", cf.Config)
	}
	if len(cf.Config.Env) != 0 || len(cf.Config.Cmd) != 0 {
		t.Errorf("unexpected env/cmd: %+v", cf.Config)
	}
}
