package images

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations on index.json's descriptor that name the image. containerd
// 1.6's importer takes io.containerd.image.name as it is; it reads
// org.opencontainers.image.ref.name as a full ref only without
// `ctr images import --base-name` (with one, it skips a ref lacking that
// prefix), and prefixes a bare tag with "import-<date>:". An archive with
// neither imports nothing, and ctr still exits 0.
const (
	ContainerdNameAnnotation = "io.containerd.image.name"
	// RefNameAnnotation is also the OCI layout's name for other tools.
	RefNameAnnotation = "org.opencontainers.image.ref.name"
)

// archive returns r's archive in dir, writing it first if it is not there.
func (r recipe) archive(dir string) (Image, error) {
	path := filepath.Join(dir, r.name+"-"+r.key+".tar")
	img := Image{Name: r.name, Ref: r.ref, Archive: path}
	// A missing, damaged or foreign file is made again (the rename replaces it).
	if d, size, err := readArchive(path, r.ref); err == nil {
		img.Digest, img.Size = d, size
		return img, nil
	}
	built, err := r.build()
	if err != nil {
		return img, fmt.Errorf("build: %w", err)
	}
	if img.Digest, img.Size, err = writeArchive(path, r.ref, built); err != nil {
		return img, err
	}
	pruneOld(dir, r.name, path)
	return img, nil
}

// writeArchive writes img as an OCI image archive (an OCI image layout in a
// tar) at path, atomically: into a temporary file in the same folder, then
// renamed. It returns the manifest's digest and the archive's size.
func writeArchive(path, ref string, img v1.Image) (v1.Hash, int64, error) {
	var none v1.Hash
	manifest, err := img.RawManifest()
	if err != nil {
		return none, 0, err
	}
	digest, err := img.Digest()
	if err != nil {
		return none, 0, err
	}
	mt, err := img.MediaType()
	if err != nil {
		return none, 0, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return none, 0, err
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mt,
			Digest:    digest,
			Size:      int64(len(manifest)),
			// The platform lets `ctr images import` pick this manifest for the
			// host without reading the config.
			Platform:    &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
			Annotations: map[string]string{ContainerdNameAnnotation: ref, RefNameAnnotation: ref},
		}},
	})
	if err != nil {
		return none, 0, err
	}

	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return none, 0, fmt.Errorf("write archive: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	// CreateTemp makes the file 0600; archives are for any user's ctr.
	if err := f.Chmod(0o644); err != nil {
		return none, 0, fmt.Errorf("write archive: %w", err)
	}
	tw := tar.NewWriter(f)
	put := func(name string, size int64, r io.Reader) error {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, r); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	putBytes := func(name string, b []byte) error { return put(name, int64(len(b)), bytes.NewReader(b)) }
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	if err := writeLayout(tw, putBytes, index); err != nil {
		return none, 0, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := putBytes(blob(digest), manifest); err != nil {
		return none, 0, fmt.Errorf("write archive %s: %w", path, err)
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return none, 0, err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return none, 0, err
	}
	if err := putBytes(blob(configName), config); err != nil {
		return none, 0, fmt.Errorf("write archive %s: %w", path, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return none, 0, err
	}
	for _, l := range layers {
		if err := putLayer(put, blob, l); err != nil {
			return none, 0, fmt.Errorf("write archive %s: %w", path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return none, 0, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return none, 0, fmt.Errorf("write archive %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return none, 0, err
	}
	if err := f.Close(); err != nil {
		return none, 0, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return none, 0, fmt.Errorf("write archive: %w", err)
	}
	ok = true
	return digest, fi.Size(), nil
}

// writeLayout writes the layout's marker file, index.json and the blob
// folders; index.json comes first in the tar so that readArchive finds it
// without reading the blobs.
func writeLayout(tw *tar.Writer, putBytes func(string, []byte) error, index []byte) error {
	if err := putBytes("index.json", index); err != nil {
		return err
	}
	if err := putBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	return nil
}

func putLayer(put func(string, int64, io.Reader) error, blob func(v1.Hash) string, l v1.Layer) error {
	d, err := l.Digest()
	if err != nil {
		return err
	}
	size, err := l.Size()
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	return put(blob(d), size, rc)
}

// readArchive returns the manifest digest named ref in the archive at path
// and the archive's size, reading only its head (index.json comes first).
func readArchive(path, ref string) (v1.Hash, int64, error) {
	var none v1.Hash
	f, err := os.Open(path)
	if err != nil {
		return none, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return none, 0, err
	}
	tr := tar.NewReader(f)
	hdr, err := tr.Next()
	if err != nil {
		return none, 0, fmt.Errorf("read %s: %w", path, err)
	}
	if hdr.Name != "index.json" {
		return none, 0, fmt.Errorf("read %s: first entry is %q, not index.json", path, hdr.Name)
	}
	var idx v1.IndexManifest
	if err := json.NewDecoder(tr).Decode(&idx); err != nil {
		return none, 0, fmt.Errorf("read %s: index.json: %w", path, err)
	}
	for _, m := range idx.Manifests {
		if m.Annotations[ContainerdNameAnnotation] == ref {
			return m.Digest, fi.Size(), nil
		}
	}
	return none, 0, fmt.Errorf("read %s: no image named %s", path, ref)
}

// pruneAge is how old another archive of an image must be before pruneOld
// removes it. Another checkout of the project on the same machine (a
// worktree, CI's clone) may be importing its own version of the image right
// now, built moments ago; one written a day ago is, at worst, built again by
// a checkout that still wants it. (Marking archives as used on every cache
// hit would say more, but would make a warm build write to the cache.)
const pruneAge = 24 * time.Hour

// pruneOld removes name's archives other than keep that were written more
// than pruneAge ago: each input change makes a new archive, and old ones
// would pile up in the cache. Errors are ignored: a file left behind only
// costs space.
func pruneOld(dir, name, keep string) {
	old, _ := filepath.Glob(filepath.Join(dir, name+"-"+strings.Repeat("[0-9a-f]", 32)+".tar"))
	for _, p := range old {
		if fi, err := os.Stat(p); p != keep && err == nil && time.Since(fi.ModTime()) > pruneAge {
			os.Remove(p)
		}
	}
}
