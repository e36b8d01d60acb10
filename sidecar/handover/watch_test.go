package handover

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTheWatchSeesOnlyAFileRenamedToItsName: what Mosquitto does at every
// save (<file>.new renamed into place); a write in place, another name's
// rename and a creation are not it. Real inotify, no broker: it runs under
// qemu-aarch64 too, where the event's layout is read in that byte order.
func TestTheWatchSeesOnlyAFileRenamedToItsName(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mosquitto.db")
	w, err := watch(file)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	write := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("mosquitto.db") // created in place: not a rename
	write("other.db.new") // renamed to another name
	if err := os.Rename(filepath.Join(dir, "other.db.new"), filepath.Join(dir, "other.db")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if err := w.next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("next = %v before any rename to the name, want the deadline", err)
	}
	cancel()
	write("mosquitto.db.new")
	if err := os.Rename(filepath.Join(dir, "mosquitto.db.new"), file); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.next(ctx); err != nil {
		t.Fatalf("next = %v after the rename into place", err)
	}
}
