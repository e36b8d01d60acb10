// Package ociimage builds multi-arch OCI images FROM scratch for the AMF
// commands and writes them into an OCI image layout directory, without a
// Docker daemon, using github.com/google/go-containerregistry.
//
// Each image has one layer holding the static binary at /<name> (mode 0755,
// owned 65532:65532), a config with Entrypoint ["/<name>"], User
// "65532:65532" and WorkingDir "/", and no shell. Each command becomes one
// image index (linux/amd64 + linux/arm64) annotated with
// org.opencontainers.image.ref.name = <registry>/<name>:<tag>.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the uid and gid the images run as (distroless "nonroot").
const NonRoot = 65532

// RefNameAnnotation is the OCI annotation naming an image in a layout.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// DefaultRegistry and DefaultTag name the images that manifests/ deploy.
const (
	DefaultRegistry = "ghcr.io/amf-edge"
	DefaultTag      = "v0.1.0"
)

// DefaultArches are the architectures built by default.
var DefaultArches = []string{"amd64", "arm64"}

// DefaultCommands are the commands packaged as images by default.
var DefaultCommands = []string{"amf-sidecar", "amf-agent"}

// Options configures Build.
type Options struct {
	Out      string   // OCI layout directory (created or appended to)
	Registry string   // e.g. ghcr.io/amf-edge
	Tag      string   // e.g. v0.1.0
	Commands []string // names under ./cmd, e.g. amf-sidecar
	Arches   []string // GOARCH values, OS is always linux
	// BinDir, if set, holds prebuilt binaries at BinDir/linux-<arch>/<cmd>;
	// otherwise Build runs `go build` from ModuleDir into a temp dir.
	BinDir    string
	ModuleDir string // module root for go build; "" = current directory
	GoCmd     string // go binary; "" = "go"
}

// Ref returns the reference name of a command's image.
func (o Options) Ref(cmd string) string {
	return fmt.Sprintf("%s/%s:%s", o.Registry, cmd, o.Tag)
}

// Result describes one built image index.
type Result struct {
	Ref    string
	Digest v1.Hash
	// Sizes maps arch to the compressed size in bytes of the image
	// (manifest + config + layer).
	Sizes map[string]int64
}

// Build builds the binaries (unless BinDir is set) and writes one image
// index per command into the OCI layout at opts.Out.
func Build(ctx context.Context, opts Options) ([]Result, error) {
	if opts.GoCmd == "" {
		opts.GoCmd = "go"
	}
	if len(opts.Arches) == 0 {
		opts.Arches = DefaultArches
	}
	if len(opts.Commands) == 0 {
		opts.Commands = DefaultCommands
	}
	binDir := opts.BinDir
	if binDir == "" {
		tmp, err := os.MkdirTemp("", "amf-images-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		binDir = tmp
		pkgs := make([]string, len(opts.Commands))
		for i, cmd := range opts.Commands {
			pkgs[i] = "./cmd/" + cmd
		}
		for _, arch := range opts.Arches {
			if err := GoBuild(ctx, opts.GoCmd, opts.ModuleDir, arch, filepath.Join(binDir, "linux-"+arch), pkgs...); err != nil {
				return nil, err
			}
		}
	}

	p, err := openOrCreate(opts.Out)
	if err != nil {
		return nil, err
	}
	var results []Result
	for _, cmd := range opts.Commands {
		idx := v1.ImageIndex(empty.Index)
		idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
		res := Result{Ref: opts.Ref(cmd), Sizes: map[string]int64{}}
		for _, arch := range opts.Arches {
			bin, err := os.ReadFile(filepath.Join(binDir, "linux-"+arch, cmd))
			if err != nil {
				return nil, err
			}
			img, err := Image(cmd, arch, bin)
			if err != nil {
				return nil, fmt.Errorf("%s linux/%s: %w", cmd, arch, err)
			}
			size, err := imageSize(img)
			if err != nil {
				return nil, err
			}
			res.Sizes[arch] = size
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
				Add: img,
				Descriptor: v1.Descriptor{
					Platform: &v1.Platform{OS: "linux", Architecture: arch},
				},
			})
		}
		ref := opts.Ref(cmd)
		// Replace a previous index with the same name so reruns don't pile up.
		if err := p.RemoveDescriptors(func(d v1.Descriptor) bool {
			return d.Annotations[RefNameAnnotation] == ref
		}); err != nil {
			return nil, err
		}
		if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefNameAnnotation: ref})); err != nil {
			return nil, fmt.Errorf("write %s: %w", ref, err)
		}
		if res.Digest, err = idx.Digest(); err != nil {
			return nil, err
		}
		results = append(results, res)
	}
	return results, nil
}

// Image returns a linux/arch image FROM scratch whose only file is the
// binary at /name, run as NonRoot.
func Image(name, arch string, bin []byte) (v1.Image, error) {
	layerTar, err := binaryTar(name, bin)
	if err != nil {
		return nil, err
	}
	return FromScratch(arch, layerTar, v1.Config{
		Entrypoint: []string{"/" + name},
		User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
		WorkingDir: "/",
	})
}

// FromScratch returns a linux/arch OCI image whose only layer is the
// uncompressed tar layerTar, with config cfg and the epoch as its creation
// time, so that the same inputs always give the same digest.
func FromScratch(arch string, layerTar []byte, cfg v1.Config) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config = *cfg.DeepCopy()
	return mutate.ConfigFile(img, cf)
}

// binaryTar is a reproducible tar holding bin at /name, 0755, NonRoot-owned.
func binaryTar(name string, bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     0o755,
		Uid:      NonRoot,
		Gid:      NonRoot,
		Size:     int64(len(bin)),
		ModTime:  time.Unix(0, 0),
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func imageSize(img v1.Image) (int64, error) {
	m, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	total := int64(len(m))
	mf, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	total += mf.Config.Size
	for _, l := range mf.Layers {
		total += l.Size
	}
	return total, nil
}

// GoBuild builds the main packages pkgs (patterns as `go build` takes them,
// relative to moduleDir or import paths) as static, trimmed, stripped
// linux/arch binaries into dir, each named after its package's last path
// element. One go command builds them all, so they build in parallel; go's
// cache makes a rebuild of unchanged packages cheap. goCmd "" means "go",
// moduleDir "" the current directory.
func GoBuild(ctx context.Context, goCmd, moduleDir, arch, dir string, pkgs ...string) error {
	if goCmd == "" {
		goCmd = "go"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("go build: output folder: %w", err)
	}
	// A trailing separator makes go build write one binary per package into dir.
	args := append([]string{"build", "-trimpath", "-ldflags", "-s -w", "-o", dir + string(os.PathSeparator)}, pkgs...)
	c := exec.CommandContext(ctx, goCmd, args...)
	c.Dir = moduleDir
	c.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0")
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("go build linux/%s %s in %q: %w\n%s", arch, strings.Join(pkgs, " "), moduleDir, err, bytes.TrimSpace(out))
	}
	return nil
}

func openOrCreate(dir string) (layout.Path, error) {
	if p, err := layout.FromPath(dir); err == nil {
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return layout.Write(dir, empty.Index)
}
