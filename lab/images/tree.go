package images

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// entry is one file, directory or symlink of an image's single layer.
type entry struct {
	Path   string `json:"path"` // absolute path in the image
	Type   byte   `json:"type"` // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	Mode   int64  `json:"mode"`
	UID    int    `json:"uid"`
	GID    int    `json:"gid"`
	Link   string `json:"link,omitempty"`   // symlink target
	SHA256 string `json:"sha256,omitempty"` // of data: what the cache key sees of the contents
	data   []byte
}

// tree is an image's root file system under construction. Parent folders are
// added as needed (root-owned, 0755), so callers only name what matters.
type tree struct {
	entries map[string]*entry
}

func newTree() *tree { return &tree{entries: map[string]*entry{}} }

// file adds a regular file.
func (t *tree) file(p string, mode int64, uid, gid int, data []byte) error {
	sum := sha256.Sum256(data)
	return t.add(&entry{Path: p, Type: tar.TypeReg, Mode: mode, UID: uid, GID: gid, SHA256: hex.EncodeToString(sum[:]), data: data})
}

// dir adds a folder, or sets the owner and mode of one already added as a parent.
func (t *tree) dir(p string, mode int64, uid, gid int) error {
	if e, ok := t.entries[path.Clean(p)]; ok && e.Type == tar.TypeDir {
		e.Mode, e.UID, e.GID = mode, uid, gid
		return nil
	}
	return t.add(&entry{Path: p, Type: tar.TypeDir, Mode: mode, UID: uid, GID: gid})
}

func (t *tree) symlink(p, target string) error {
	return t.add(&entry{Path: p, Type: tar.TypeSymlink, Mode: 0o777, Link: target})
}

func (t *tree) add(e *entry) error {
	if !path.IsAbs(e.Path) {
		return fmt.Errorf("image path %q is not absolute", e.Path)
	}
	e.Path = path.Clean(e.Path)
	if e.Path == "/" {
		return fmt.Errorf("image path / cannot be an entry")
	}
	if old, ok := t.entries[e.Path]; ok {
		// The same symlink reached twice (e.g. /lib for every library) is fine.
		if old.Type == e.Type && old.Link == e.Link && old.SHA256 == e.SHA256 && old.Mode == e.Mode && old.UID == e.UID && old.GID == e.GID {
			return nil
		}
		return fmt.Errorf("image path %s added twice, differently", e.Path)
	}
	for p := path.Dir(e.Path); p != "/"; p = path.Dir(p) {
		parent, ok := t.entries[p]
		if !ok {
			t.entries[p] = &entry{Path: p, Type: tar.TypeDir, Mode: 0o755}
			continue
		}
		if parent.Type != tar.TypeDir {
			return fmt.Errorf("image path %s: its parent %s is not a folder", e.Path, p)
		}
	}
	t.entries[e.Path] = e
	return nil
}

// hostFile copies the host file at p into the tree the way a program would
// reach it: each symlink met on the way (/lib -> usr/lib on a merged-/usr
// Debian, libfoo.so.1 -> libfoo.so.1.2.3) becomes the same symlink in the
// image and the file at the end a regular file with the host's mode, so that
// every path that works on the host works in the image.
func (t *tree) hostFile(p string) error {
	p = filepath.Clean(p)
	if !filepath.IsAbs(p) {
		return fmt.Errorf("host file %q: not an absolute path", p)
	}
	for hops := 0; hops < 40; hops++ {
		next, err := t.firstSymlink(p)
		if err != nil {
			return err
		}
		if next == "" {
			data, err := os.ReadFile(p)
			if err != nil {
				return fmt.Errorf("host file: %w", err)
			}
			fi, err := os.Stat(p)
			if err != nil {
				return fmt.Errorf("host file: %w", err)
			}
			if !fi.Mode().IsRegular() {
				return fmt.Errorf("host file %s is not a regular file (%s)", p, fi.Mode())
			}
			return t.file(p, int64(fi.Mode().Perm()), 0, 0, data)
		}
		p = next
	}
	return fmt.Errorf("host file %s: too many levels of symlinks", p)
}

// firstSymlink adds the first symlink on p's way to the tree and returns p
// with it resolved, or "" if no component of p is a symlink.
func (t *tree) firstSymlink(p string) (string, error) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		here := filepath.Join(cur, part)
		fi, err := os.Lstat(here)
		if err != nil {
			return "", fmt.Errorf("host file %s: %w", p, err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(here)
			if err != nil {
				return "", fmt.Errorf("host file %s: %w", p, err)
			}
			if err := t.symlink(here, target); err != nil {
				return "", err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			return filepath.Join(append([]string{target}, parts[i+1:]...)...), nil
		}
		cur = here
	}
	return "", nil
}

// sorted returns the entries in path order, which puts every folder before
// what it holds.
func (t *tree) sorted() []*entry {
	out := make([]*entry, 0, len(t.entries))
	for _, e := range t.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// layer is the tree as an uncompressed, reproducible tar: fixed order,
// epoch timestamps, no user or group names.
func (t *tree) layer() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range t.sorted() {
		hdr := &tar.Header{
			Typeflag: e.Type,
			Name:     strings.TrimPrefix(e.Path, "/"),
			Linkname: e.Link,
			Mode:     e.Mode,
			Uid:      e.UID,
			Gid:      e.GID,
			Size:     int64(len(e.data)),
			ModTime:  time.Unix(0, 0),
			Format:   tar.FormatPAX,
		}
		if e.Type == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer %s: %w", e.Path, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer %s: %w", e.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
