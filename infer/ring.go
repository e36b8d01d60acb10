package infer

// series is a time-ordered ring of points. It grows by doubling until it holds what
// the windows need, then reuses its storage: steady-state pushes do not allocate.
type series struct {
	buf  []Point
	head int // index of the oldest point
	n    int
}

func (s *series) len() int { return s.n }

func (s *series) at(i int) Point { return s.buf[(s.head+i)%len(s.buf)] }

func (s *series) push(p Point) {
	if s.n == len(s.buf) {
		s.grow()
	}
	s.buf[(s.head+s.n)%len(s.buf)] = p
	s.n++
}

func (s *series) grow() {
	size := 2 * len(s.buf)
	if size == 0 {
		size = 64
	}
	buf := make([]Point, size)
	for i := 0; i < s.n; i++ {
		buf[i] = s.at(i)
	}
	s.buf, s.head = buf, 0
}

// dropThrough removes every point with T <= t.
func (s *series) dropThrough(t int64) {
	for s.n > 0 && s.buf[s.head].T <= t {
		s.head = (s.head + 1) % len(s.buf)
		s.n--
	}
}

// firstAfter returns the index of the first point with T > t (binary search).
func (s *series) firstAfter(t int64) int {
	lo, hi := 0, s.n
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.at(mid).T <= t {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// window appends to dst the points with from < T <= to (PromQL's left-open range)
// and returns it.
func (s *series) window(dst []Point, from, to int64) []Point {
	for i := s.firstAfter(from); i < s.n; i++ {
		p := s.at(i)
		if p.T > to {
			break
		}
		dst = append(dst, p)
	}
	return dst
}

// newest returns the newest point with from < T <= to: PromQL's instant selector
// with lookback.
func (s *series) newest(from, to int64) (Point, bool) {
	i := s.firstAfter(to) - 1
	if i < 0 {
		return Point{}, false
	}
	p := s.at(i)
	if p.T <= from {
		return Point{}, false
	}
	return p, true
}
