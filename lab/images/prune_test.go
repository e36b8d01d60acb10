package images

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Another checkout on the machine may be importing its own archive of an
// image right now: pruneOld removes only archives written pruneAge ago.
func TestPruneOldKeepsArchivesInUseElsewhere(t *testing.T) {
	dir := t.TempDir()
	name := func(c string) string { return filepath.Join(dir, "mosquitto-"+strings.Repeat(c, 32)+".tar") }
	files := []struct {
		path     string
		age      time.Duration
		wantKept bool
	}{
		{name("a"), 48 * time.Hour, true}, // keep, however old
		{name("b"), time.Minute, true},    // another checkout's, just built
		{name("c"), 23 * time.Hour, true}, // written within the day
		{name("d"), 25 * time.Hour, false},
		{filepath.Join(dir, "pause-"+strings.Repeat("e", 32)+".tar"), 48 * time.Hour, true}, // another image
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-f.age)
		if err := os.Chtimes(f.path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	pruneOld(dir, "mosquitto", files[0].path)
	for _, f := range files {
		_, err := os.Stat(f.path)
		if kept := err == nil; kept != f.wantKept {
			t.Errorf("%s (written %v ago): kept %v, want %v", filepath.Base(f.path), f.age, kept, f.wantKept)
		}
	}
}
