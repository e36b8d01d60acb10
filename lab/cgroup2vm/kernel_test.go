package cgroup2vm

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestNewestCachedKernel(t *testing.T) {
	dir := t.TempDir()
	if _, ok := newestCached(dir); ok {
		t.Fatal("an empty cache has a kernel")
	}
	for i, name := range []string{"linux-image-6.1.0-56-cloud-amd64_6.1.190-1", "linux-image-6.1.0-57-cloud-amd64_6.1.192-3"} {
		img := filepath.Join(dir, name, "vmlinuz")
		if err := os.MkdirAll(filepath.Dir(img), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(img, []byte("bzImage"), 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(time.Duration(i-2) * time.Hour)
		if err := os.Chtimes(img, at, at); err != nil {
			t.Fatal(err)
		}
	}
	k, ok := newestCached(dir)
	if !ok || k.Package != "linux-image-6.1.0-57-cloud-amd64" || k.Version != "6.1.192-3" || filepath.Base(filepath.Dir(k.Image)) != k.Package+"_"+k.Version {
		t.Errorf("newest cached = %+v, %v; want the 6.1.0-57 one", k, ok)
	}
}

func TestCopyImageTakesOnlyTheKernel(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range []struct{ name, body string }{
		{"./lib/modules/6.1.0-57-cloud-amd64/kernel/virtio_blk.ko", "module"},
		{"./boot/config-6.1.0-57-cloud-amd64", "CONFIG_CGROUPS=y"},
		{"./boot/vmlinuz-6.1.0-57-cloud-amd64", "bzImage"},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "vmlinuz")
	found, err := copyImage(&b, dst)
	if err != nil || !found {
		t.Fatalf("copyImage = %v, %v", found, err)
	}
	if got, err := os.ReadFile(dst); err != nil || string(got) != "bzImage" {
		t.Errorf("image %q, %v; want the bzImage", got, err)
	}
	found, err = copyImage(bytes.NewReader(nil), filepath.Join(t.TempDir(), "none"))
	if found || err != nil {
		t.Errorf("copyImage of an empty archive = %v, %v; want not found", found, err)
	}
}
