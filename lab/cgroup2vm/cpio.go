package cgroup2vm

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// File modes of cpio entries (the st_mode bits of the newc format).
const (
	modeDir     = 0o040000
	modeFile    = 0o100000
	modeSymlink = 0o120000
	modeCharDev = 0o020000
)

// cpioWriter writes an uncompressed "newc" cpio archive, the format the
// kernel unpacks as an initramfs. Every entry is owned by root.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	dirs map[string]bool // directories written so far
	err  error
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriter(w), ino: 1, dirs: map[string]bool{"": true, ".": true}}
}

// entry writes one header, the name and the data, each padded to 4 bytes.
func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	nlink := uint32(1)
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.ino++
	c.write([]byte(hdr))
	c.write([]byte(name))
	c.write([]byte{0})
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// dir writes the directory name and its missing parents.
func (c *cpioWriter) dir(name string) {
	name = strings.Trim(path.Clean(name), "/")
	if c.dirs[name] {
		return
	}
	c.dir(path.Dir(name))
	c.dirs[name] = true
	c.entry(name, modeDir|0o755, 0, 0, nil)
}

// file writes a regular file (and its missing parent directories).
func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	name = strings.Trim(path.Clean(name), "/")
	c.dir(path.Dir(name))
	c.entry(name, modeFile|perm, 0, 0, data)
}

// symlink writes a symbolic link to target.
func (c *cpioWriter) symlink(name, target string) {
	name = strings.Trim(path.Clean(name), "/")
	c.dir(path.Dir(name))
	c.entry(name, modeSymlink|0o777, 0, 0, []byte(target))
}

// charDev writes a character device node.
func (c *cpioWriter) charDev(name string, major, minor uint32) {
	name = strings.Trim(path.Clean(name), "/")
	c.dir(path.Dir(name))
	c.entry(name, modeCharDev|0o600, major, minor, nil)
}

// tree copies the directory src (files, directories and symlinks) to dst.
func (c *cpioWriter) tree(dst, src string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		name := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			c.symlink(name, target)
		case d.IsDir():
			c.dir(name)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			perm := uint32(0o644)
			if info, err := d.Info(); err == nil && info.Mode()&0o111 != 0 {
				perm = 0o755
			}
			c.file(name, perm, b)
		}
		return c.err
	})
}

// close writes the trailer and flushes.
func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
