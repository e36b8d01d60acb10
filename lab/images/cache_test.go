package images

import (
	"context"
	"crypto/sha256"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// stamp is what a write to a file changes.
type stamp struct {
	ino   uint64
	mtime time.Time
	size  int64
}

// snapshot stamps every file of dir.
func snapshot(t *testing.T, dir string) map[string]stamp {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]stamp{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = stamp{fi.Sys().(*syscall.Stat_t).Ino, fi.ModTime(), fi.Size()}
	}
	return out
}

// TestSecondBuildWritesNothing runs Build again over the warm cache, once
// through `go build` (which must give the same binaries) and once with the
// binaries given: neither may write a file.
func TestSecondBuildWritesNothing(t *testing.T) {
	f := built(t)
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"go build", Options{CacheDir: f.cacheDir}},
		{"binaries given", Options{CacheDir: f.cacheDir, BinDir: f.binDir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := snapshot(t, f.cacheDir)
			t0 := time.Now()
			imgs, err := Build(context.Background(), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("warm Build (%s): %v", tc.name, time.Since(t0).Round(time.Millisecond))
			if after := snapshot(t, f.cacheDir); !maps.Equal(before, after) {
				t.Errorf("the cache changed:\nbefore %v\nafter  %v", before, after)
			}
			for i, img := range imgs {
				if img != f.images[i] {
					t.Errorf("second build %+v, first %+v", img, f.images[i])
				}
			}
		})
	}
}

// TestBuildIsReproducibleAndRebuildsOnlyWhatChanged builds into a second
// cache: identical bytes; then changes one binary: only its image is
// written again, beside its previous archive (recent, so kept).
func TestBuildIsReproducibleAndRebuildsOnlyWhatChanged(t *testing.T) {
	f := built(t)
	cache := t.TempDir()
	imgs, err := Build(context.Background(), Options{CacheDir: cache, BinDir: f.binDir})
	if err != nil {
		t.Fatal(err)
	}
	for i, img := range imgs {
		first := f.images[i]
		if img.Digest != first.Digest || filepath.Base(img.Archive) != filepath.Base(first.Archive) {
			t.Errorf("%s: digest %s archive %s, first build %s %s", img.Name, img.Digest, img.Archive, first.Digest, first.Archive)
		}
		if fileSum(t, img.Archive) != fileSum(t, first.Archive) {
			t.Errorf("%s: archives differ", img.Name)
		}
	}

	bins := t.TempDir()
	for _, p := range programs() {
		b, err := os.ReadFile(filepath.Join(f.binDir, p.name))
		if err != nil {
			t.Fatal(err)
		}
		if p.name == Agent {
			b = append(b, 0) // a changed binary, as after an edit
		}
		if err := os.WriteFile(filepath.Join(bins, p.name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, cache)
	again, err := Build(context.Background(), Options{CacheDir: cache, BinDir: bins})
	if err != nil {
		t.Fatal(err)
	}
	after := snapshot(t, cache)
	for i, img := range again {
		old := filepath.Base(imgs[i].Archive)
		name := filepath.Base(img.Archive)
		if img.Name != Agent {
			if name != old || after[name] != before[name] {
				t.Errorf("%s was written again though its inputs did not change", img.Name)
			}
			continue
		}
		if name == old || img.Digest == imgs[i].Digest {
			t.Errorf("%s: same archive %s after its binary changed", img.Name, name)
		}
		// Just written, it may be another checkout's: kept (pruneOld
		// removes it once it is a day old, TestPruneOld...).
		if _, ok := after[old]; !ok {
			t.Errorf("%s: the previous archive %s, a moment old, was removed", img.Name, old)
		}
	}
	if len(after) != len(again)+1 {
		t.Errorf("cache holds %d files, want one archive per image and the agent's previous one: %v", len(after), after)
	}
}

func fileSum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}
