package cgroup

import (
	"errors"
	"fmt"
	"syscall"
)

// maxFileSize bounds how much of one kernel file is read; the largest file
// read per sample, net/dev, is a few KiB even with many interfaces.
const maxFileSize = 4 << 20

// fileReader reads small kernel files into one reused buffer. It uses raw
// syscalls rather than os.Open because an *os.File costs an allocation and an
// extra fstat per open, which adds up at one read of five files per second.
type fileReader struct {
	buf []byte
}

// read returns the whole content of path. The slice is valid until the next
// call.
func (f *fileReader) read(path string) ([]byte, error) {
	if f.buf == nil {
		f.buf = make([]byte, 4096)
	}
	fd, err := openRetry(path)
	if err != nil {
		return nil, readError(path, err)
	}
	defer syscall.Close(fd)
	n := 0
	for {
		if n == len(f.buf) {
			if len(f.buf) >= maxFileSize {
				return nil, fmt.Errorf("read %s: larger than %d bytes", path, maxFileSize)
			}
			f.buf = append(f.buf, make([]byte, len(f.buf))...)
		}
		m, err := syscall.Read(fd, f.buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, readError(path, err)
		}
		if m == 0 {
			return f.buf[:n], nil
		}
		n += m
	}
}

func openRetry(path string) (int, error) {
	for {
		fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != syscall.EINTR {
			return fd, err
		}
	}
}

// readError maps the errors of a vanished target to ErrGone: ENOENT when the
// cgroup directory or /proc/<pid> is gone, ENODEV when a cgroup is removed
// while its file is open, ESRCH when a process exits during the read.
func readError(path string, err error) error {
	if isGoneErr(err) {
		return fmt.Errorf("read %s: %w: %w", path, ErrGone, err)
	}
	return fmt.Errorf("read %s: %w", path, err)
}

func isGoneErr(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.ESRCH)
}
