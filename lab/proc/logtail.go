package proc

import (
	"bytes"
	"io"
	"os"
)

// LogTail returns at most n bytes from the end of the file at path, starting
// at a line, for error messages and dumps of a daemon's log; "" if it cannot
// be read (the message it would decorate matters more).
func LogTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-n, 0)
	if off == 0 {
		b, _ := io.ReadAll(f)
		return string(b)
	}
	// From the byte before the cut: if it ends a line, the tail starts at one.
	b, _ := io.ReadAll(io.NewSectionReader(f, off-1, fi.Size()-off+1))
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return string(b[i+1:])
	}
	return ""
}
