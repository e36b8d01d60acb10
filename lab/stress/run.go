package stress

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Status is what Run is doing.
type Status struct {
	Phase      int       // 1-based
	Phases     int       // how many the profile has
	PhaseStart time.Time // when this phase began
	Target     int64     // this phase's memory target, bytes
	Held       int64     // bytes mapped and touched now (page-rounded)
	CPU        float64   // cores being burnt in this phase
	Done       bool      // the profile ended and everything is released
}

const (
	tick     = 50 * time.Millisecond  // how often a ramp grows the memory
	slice    = 100 * time.Millisecond // CPU duty-cycle period
	mmapUnit = 1 << 20                // memory is mapped in regions of at most this many bytes
)

// Run plays the profile: in each phase it holds the phase's memory (reached at
// once, or growing at Ramp bytes/s from what the previous phase left; a lower
// target is released at once with munmap) and burns the phase's CPU. It calls
// report, from Run's own goroutine, whenever the phase or the bytes held change
// — at a phase's start before any allocation, so that a phase that gets the
// process OOM-killed has been reported — and once with Done at the end. It
// releases everything and returns when the profile ends (nil) or ctx ends
// (ctx's error).
//
// Memory is anonymous private mappings whose every page is written, so the
// kernel charges it to the process's memory cgroup; a target over the cgroup's
// limit makes the kernel OOM-kill the process, which is the point: nothing here
// handles it. The Go runtime's own few MiB come on top of the targets.
//
// With InMemoryFile the memory is a memory file's pages instead (shmem,
// written, never mapped): still charged to the cgroup, but outside the
// process's RSS, which is what the kernel's OOM killer ranks processes by. In
// a container on cgroup v1, where the OOM killer ends one process, the victim
// is then the container's main process (the broker) and the container dies
// OOMKilled, as cgroup v2's memory.oom.group (Kubernetes ≥ 1.28) would end the
// whole container; with anonymous memory the injector itself would die.
func Run(ctx context.Context, p Profile, report func(Status), opts ...Option) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if report == nil {
		report = func(Status) {}
	}
	mem := memory{fd: -1}
	for _, o := range opts {
		if err := o(&mem); err != nil {
			return err
		}
	}
	defer mem.close()
	defer mem.release()
	for i, ph := range p.Phases {
		st := Status{Phase: i + 1, Phases: len(p.Phases), PhaseStart: time.Now(), Target: ph.Memory, Held: mem.held, CPU: ph.CPU}
		report(st)
		stopCPU := burn(ph.CPU)
		err := playPhase(ctx, ph, &mem, st, report)
		stopCPU()
		if err != nil {
			return fmt.Errorf("phase %d: %w", i+1, err)
		}
	}
	if err := mem.release(); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	report(Status{Phases: len(p.Phases), Done: true})
	return nil
}

// playPhase moves the memory towards the phase's target until the phase ends.
func playPhase(ctx context.Context, ph Phase, mem *memory, st Status, report func(Status)) error {
	end := st.PhaseStart.Add(ph.Duration)
	from := mem.held
	timer := time.NewTimer(ph.Duration)
	defer timer.Stop()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		want := ph.Memory
		if ph.Ramp > 0 && ph.Memory > from {
			grown := float64(from) + float64(ph.Ramp)*time.Since(st.PhaseStart).Seconds()
			want = int64(math.Min(grown, float64(ph.Memory)))
		}
		if err := mem.set(ctx, want); err != nil {
			return err
		}
		if mem.held != st.Held {
			st.Held = mem.held
			report(st)
		}
		if !time.Now().Before(end) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		case <-t.C:
		}
	}
}

// Option changes how Run holds memory.
type Option func(*memory) error

// InMemoryFile holds the memory in a memory file (memfd) rather than in
// anonymous mappings: see Run.
func InMemoryFile() Option {
	return func(m *memory) error {
		fd, err := unix.MemfdCreate("amf-lab-stress", unix.MFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("memfd_create: %w", err)
		}
		m.fd = fd
		return nil
	}
}

// memory is the set of regions held, or a memory file's size.
type memory struct {
	regions [][]byte
	held    int64
	fd      int    // the memory file; -1: anonymous mappings
	buf     []byte // what the memory file's pages are written from, made once
}

func (m *memory) close() {
	if m.fd >= 0 {
		unix.Close(m.fd)
	}
}

// setFile grows the memory file by writing its pages (which allocates and
// charges them) or shrinks it with ftruncate (which frees them).
func (m *memory) setFile(ctx context.Context, want int64) error {
	if want < m.held {
		if err := unix.Ftruncate(m.fd, want); err != nil {
			return fmt.Errorf("ftruncate the memory file to %d bytes: %w", want, err)
		}
		m.held = want
		return nil
	}
	if m.held == want {
		return nil // the steady case, every tick: no work, no allocation
	}
	if m.buf == nil {
		m.buf = bytes.Repeat([]byte{1}, mmapUnit)
	}
	buf := m.buf
	for m.held < want {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(want-m.held, mmapUnit)
		w, err := unix.Pwrite(m.fd, buf[:n], m.held)
		if err != nil {
			return fmt.Errorf("write the memory file (holding %d): %w", m.held, err)
		}
		m.held += int64(w)
	}
	return nil
}

var pageSize = int64(os.Getpagesize())

// set maps or unmaps regions so that the bytes held are want rounded up to a
// page.
func (m *memory) set(ctx context.Context, want int64) error {
	want = (want + pageSize - 1) / pageSize * pageSize
	if m.fd >= 0 {
		return m.setFile(ctx, want)
	}
	for m.held > want {
		last := m.regions[len(m.regions)-1]
		if err := syscall.Munmap(last); err != nil {
			return fmt.Errorf("munmap %d bytes: %w", len(last), err)
		}
		m.regions = m.regions[:len(m.regions)-1]
		m.held -= int64(len(last))
	}
	for m.held < want {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(want-m.held, mmapUnit)
		b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
		if err != nil {
			return fmt.Errorf("mmap %d bytes (holding %d): %w", n, m.held, err)
		}
		// Writing a page is what makes the kernel allocate it and charge it to
		// the cgroup; a mapping never written costs nothing.
		for i := 0; i < len(b); i += int(pageSize) {
			b[i] = 1
		}
		m.regions = append(m.regions, b)
		m.held += n
	}
	return nil
}

func (m *memory) release() error { return m.set(context.Background(), 0) }

// burn burns cores of CPU until stop is called: ceil(cores) goroutines, each on
// its own OS thread, each busy for cores/n of every 100 ms slice, their slices
// staggered so the load is spread over the period rather than bunched (a
// container's CFS quota is enforced per 100 ms period too).
//
// Each worker gets a P of its own: Go sizes GOMAXPROCS to the machine's CPUs
// (and a container's limit, at least 2), and workers beyond it would take
// turns on the Ps, so a load of more cores than that would put only
// GOMAXPROCS threads before the kernel's scheduler, not n.
func burn(cores float64) (stop func()) {
	n, duty := split(cores)
	if n == 0 {
		return func() {}
	}
	restore := func() {}
	if prev := runtime.GOMAXPROCS(0); n > prev {
		runtime.GOMAXPROCS(n)
		restore = func() { runtime.GOMAXPROCS(prev) }
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			burnWorker(done, duty, start.Add(slice*time.Duration(i)/time.Duration(n)))
		}()
	}
	return func() {
		close(done)
		wg.Wait()
		restore()
	}
}

// split spreads cores over the fewest workers that can each reach their share:
// n = ceil(cores), each busy duty = cores/n of the time.
func split(cores float64) (n int, duty float64) {
	n = int(math.Ceil(cores))
	if n == 0 {
		return 0, 0
	}
	return n, cores / float64(n)
}

// burnWorker spins until its thread has used duty × slice of CPU time in the
// current slice (or the slice is over), then sleeps to the next slice. Counting
// the thread's CPU time rather than wall time keeps the load right when the
// machine is busy and the thread is preempted while spinning.
func burnWorker(done <-chan struct{}, duty float64, start time.Time) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	budget := time.Duration(duty * float64(slice))
	x := 1.0
	for k := 0; ; k++ {
		sliceStart := start.Add(time.Duration(k) * slice)
		sliceEnd := sliceStart.Add(slice)
		if now := time.Now(); now.After(sliceEnd) {
			continue // a slice missed entirely (stopped process, busy machine): do not catch up
		} else if d := sliceStart.Sub(now); d > 0 {
			select {
			case <-done:
				return
			case <-time.After(d):
			}
		}
		select {
		case <-done:
			return
		default:
		}
		used := cpuClock()
		for used() < budget && time.Now().Before(sliceEnd) {
			for range 2000 {
				x = x*1.0000001 + 1e-9
			}
			runtime.KeepAlive(x) // the spin must not be optimised away
		}
	}
}

// cpuClock returns a function giving the CPU time the calling thread has used
// since cpuClock was called (CLOCK_THREAD_CPUTIME_ID, exact to the nanosecond,
// unlike getrusage which can lag by a scheduler tick). Where that clock is
// unavailable it measures wall time instead, which is right on an idle machine.
func cpuClock() func() time.Duration {
	t0, ok := threadCPU()
	if !ok {
		w0 := time.Now()
		return func() time.Duration { return time.Since(w0) }
	}
	return func() time.Duration {
		t, _ := threadCPU()
		return t - t0
	}
}

func threadCPU() (time.Duration, bool) {
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	var ts syscall.Timespec
	_, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano()), errno == 0
}
