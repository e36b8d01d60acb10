package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	ociimage "github.com/amf-edge/amf/ociimage"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Refs of the lab's own images. The project's images keep the refs
// manifests/ deploy (ociimage's DefaultRegistry and DefaultTag).
const (
	PauseRef = "amf.lab/pause:v1"
	// MosquittoRef is Debian's build of Mosquitto 2.0.11, not the Eclipse one:
	// the tag says so.
	MosquittoRef = "amf.lab/mosquitto:2.0.11-debian"
	LabRef       = "amf.lab/amf-lab:v1"
)

// Names of the images, in the order Build returns them. The program names
// are also the binaries' names.
const (
	Pause     = "pause"
	Mosquitto = "mosquitto"
	Sidecar   = "amf-sidecar"
	Agent     = "amf-agent"
	Lab       = "amf-lab"
)

// PauseUser is the uid and gid of the pause image, as in Kubernetes' own.
const PauseUser = 65535

// DefaultMosquitto is where Debian's mosquitto package puts the broker.
const DefaultMosquitto = "/usr/sbin/mosquitto"

// DefaultMosquittoSub is where Debian's mosquitto-clients package puts
// mosquitto_sub.
const DefaultMosquittoSub = "/usr/bin/mosquitto_sub"

// Image is one built image.
type Image struct {
	Name string // Pause, Mosquitto, Sidecar, Agent or Lab
	Ref  string
	// Archive is an OCI image archive for `ctr -n k8s.io images import`,
	// in Options.CacheDir. Build never rewrites an archive in place, so it
	// may be read while another Build runs.
	Archive string
	// Digest is the image manifest's, as `ctr images ls` shows it.
	Digest v1.Hash
	// Size is the archive's size in bytes.
	Size int64
}

// Options configures Build. The zero value builds from the current
// directory's module into the user's cache folder.
type Options struct {
	// CacheDir holds the archives (default: <user cache folder>/amf/images,
	// ~/.cache/amf/images, shared by every clone on the machine).
	CacheDir string
	// ModuleDir is a folder of the AMF module to run `go build` in
	// (default: the current directory).
	ModuleDir string
	GoCmd     string // go command (default "go")
	// Mosquitto is the broker binary, a file of Debian's mosquitto package
	// (default DefaultMosquitto).
	Mosquitto string
	// MosquittoSub is the client beside it in the image, a file of Debian's
	// mosquitto-clients package (default DefaultMosquittoSub).
	MosquittoSub string
	// BinDir optionally holds prebuilt static linux/GOARCH binaries named
	// after their programs (BinDir/amf-lab, ..., as `make build` writes
	// them); programs missing there are built.
	BinDir string
}

func (o Options) withDefaults() (Options, error) {
	if o.CacheDir == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return o, fmt.Errorf("images: no cache folder for the archives: %w (set Options.CacheDir)", err)
		}
		o.CacheDir = filepath.Join(c, "amf", "images")
	}
	if o.Mosquitto == "" {
		o.Mosquitto = DefaultMosquitto
	}
	if o.MosquittoSub == "" {
		o.MosquittoSub = DefaultMosquittoSub
	}
	return o, nil
}

// programs are the binaries the images hold, by name, with their packages.
func programs() []struct{ name, pkg string } {
	const mod = "github.com/amf-edge/amf/"
	return []struct{ name, pkg string }{
		{Pause, mod + "lab/images/pause"},
		{Sidecar, mod + "cmd/amf-sidecar"},
		{Agent, mod + "cmd/amf-agent"},
		{Lab, mod + "cmd/amf-lab"},
	}
}

// Binaries builds the static linux/GOARCH binaries the images hold into dir
// (dir/pause, dir/amf-sidecar, dir/amf-agent, dir/amf-lab), skipping those
// already in opts.BinDir. Go's build cache makes an unchanged rebuild take
// about a second.
func Binaries(ctx context.Context, opts Options, dir string) error {
	var pkgs []string
	for _, p := range programs() {
		if opts.BinDir != "" && regularFile(filepath.Join(opts.BinDir, p.name)) {
			continue
		}
		pkgs = append(pkgs, p.pkg)
	}
	if len(pkgs) == 0 {
		return nil
	}
	// Import paths, not ./cmd/..., so that any folder of the module will do.
	if err := ociimage.GoBuild(ctx, opts.GoCmd, opts.ModuleDir, runtime.GOARCH, dir, pkgs...); err != nil {
		return fmt.Errorf("images: %w (ModuleDir must be inside the AMF module)", err)
	}
	return nil
}

// Build builds every image for linux/GOARCH, or finds it in opts.CacheDir,
// and returns them in the order of the Name constants. Binaries not in
// opts.BinDir are built with `go build` first.
func Build(ctx context.Context, opts Options) ([]Image, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("images: cache folder: %w", err)
	}
	tmp, err := os.MkdirTemp("", "amf-lab-images-")
	if err != nil {
		return nil, fmt.Errorf("images: folder for the binaries: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := Binaries(ctx, opts, tmp); err != nil {
		return nil, err
	}
	bins := map[string][]byte{}
	for _, p := range programs() {
		path := filepath.Join(tmp, p.name)
		if !regularFile(path) {
			path = filepath.Join(opts.BinDir, p.name)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("images: binary %s: %w", p.name, err)
		}
		bins[p.name] = b
	}

	arch := runtime.GOARCH
	pause, err := pauseRecipe(arch, bins[Pause])
	if err != nil {
		return nil, err
	}
	mosq, err := mosquittoRecipe(arch, opts.Mosquitto, opts.MosquittoSub, bins[Lab])
	if err != nil {
		return nil, err
	}
	recipes := []recipe{pause, mosq}
	project := ociimage.Options{Registry: ociimage.DefaultRegistry, Tag: ociimage.DefaultTag}
	for _, r := range []struct{ name, ref string }{{Sidecar, project.Ref(Sidecar)}, {Agent, project.Ref(Agent)}, {Lab, LabRef}} {
		rc, err := projectRecipe(r.name, r.ref, arch, bins[r.name])
		if err != nil {
			return nil, err
		}
		recipes = append(recipes, rc)
	}

	out := make([]Image, 0, len(recipes))
	for _, r := range recipes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		img, err := r.archive(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("images: %s: %w", r.ref, err)
		}
		out = append(out, img)
	}
	return out, nil
}

// cacheFormat is part of every cache key: bump it when something the keys
// do not hash changes what an archive holds (the archive's layout, the tar
// or gzip encoding of layers).
const cacheFormat = "amf-lab-images/1"

// recipe is one image, not built yet: key hashes everything it is made of,
// build makes it.
type recipe struct {
	name, ref string
	key       string
	build     func() (v1.Image, error)
}

// treeRecipe is an image of one layer made of t, with config cfg.
func treeRecipe(name, ref, arch string, t *tree, cfg v1.Config) (recipe, error) {
	entries := t.sorted()
	k, err := json.Marshal(struct {
		Format, Ref, Arch string
		Config            v1.Config
		Entries           []*entry
	}{cacheFormat, ref, arch, cfg, entries})
	if err != nil {
		return recipe{}, err
	}
	return recipe{name: name, ref: ref, key: hashKey(k), build: func() (v1.Image, error) {
		layer, err := t.layer()
		if err != nil {
			return nil, err
		}
		return ociimage.FromScratch(arch, layer, cfg)
	}}, nil
}

// projectRecipe is the image ociimage makes of the binary bin.
func projectRecipe(name, ref, arch string, bin []byte) (recipe, error) {
	// The image of an empty binary stands for ociimage's recipe: any change
	// to its layout or config changes this digest, and so the key.
	shape, err := ociimage.Image(name, arch, nil)
	if err != nil {
		return recipe{}, fmt.Errorf("images: %s: %w", ref, err)
	}
	shapeDigest, err := shape.Digest()
	if err != nil {
		return recipe{}, fmt.Errorf("images: %s: %w", ref, err)
	}
	sum := sha256.Sum256(bin)
	k := strings.Join([]string{cacheFormat, ref, arch, shapeDigest.String(), hex.EncodeToString(sum[:])}, "\n")
	return recipe{name: name, ref: ref, key: hashKey([]byte(k)), build: func() (v1.Image, error) {
		return ociimage.Image(name, arch, bin)
	}}, nil
}

// pauseRecipe is the pod sandbox image: the pause binary alone, no shell.
func pauseRecipe(arch string, bin []byte) (recipe, error) {
	t := newTree()
	if err := t.file("/pause", 0o755, 0, 0, bin); err != nil {
		return recipe{}, err
	}
	return treeRecipe(Pause, PauseRef, arch, t, v1.Config{
		Entrypoint: []string{"/pause"},
		User:       fmt.Sprintf("%d:%d", PauseUser, PauseUser),
		WorkingDir: "/",
	})
}

func hashKey(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

func regularFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}
