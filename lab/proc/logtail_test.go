package proc

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLogTailStartsAtALine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, []byte("first line\nsecond\nthird\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{1 << 10, "first line\nsecond\nthird\n"}, // all of it
		{13, "second\nthird\n"},                  // cut exactly at a line's start
		{12, "third\n"},                          // cut inside "second": from the next line
		{6, "third\n"},                           // just the last line
		{5, ""},                                  // inside the last line: no whole line
	} {
		if got := LogTail(path, tc.n); got != tc.want {
			t.Errorf("LogTail(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if got := LogTail(filepath.Join(t.TempDir(), "missing"), 10); got != "" {
		t.Errorf("LogTail of a missing file = %q, want empty", got)
	}
}
