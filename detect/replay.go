package detect

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
)

// Replay input columns: raw counters and gauges as a scraper would record them.
var replayColumns = [...]string{"time", "cpu_seconds_total", "memory_bytes", "memory_limit_bytes", "network_bytes_total", "disk_bytes_total"}

// InputError reports bad input: where it is and what is wrong.
type InputError struct {
	Line   int    // 1-based line in the input
	Column string // column name, empty when the whole line is at fault
	Err    error
}

func (e *InputError) Error() string {
	if e.Column == "" {
		return fmt.Sprintf("line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("line %d, column %s: %v", e.Line, e.Column, e.Err)
}

func (e *InputError) Unwrap() error { return e.Err }

// Replay reads raw samples as CSV (header: time, cpu_seconds_total, memory_bytes,
// memory_limit_bytes, network_bytes_total, disk_bytes_total, in any order; time in
// Unix seconds, may be fractional; an empty field is a series without a point at that
// time) and writes the six features evaluated at each row's time, one row per input
// row. With cfg.PredictWindow set, the memory projection follows as a last column,
// infer.ProjectionName. An undefined feature is an empty field. On bad input it stops at the bad line
// and returns an *InputError; rows before it have been written, nothing of it.
func Replay(in io.Reader, out io.Writer, cfg infer.Config) error {
	eng, err := infer.NewEngine(cfg)
	if err != nil {
		return err
	}
	r := csv.NewReader(in)
	r.ReuseRecord = true
	header, err := r.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return &InputError{Line: 1, Err: errors.New("empty input: expected a header " + strings.Join(replayColumns[:], ","))}
		}
		return csvError(err)
	}
	idx, err := columnIndex(header, replayColumns[:])
	if err != nil {
		return &InputError{Line: 1, Err: err}
	}

	w := bufio.NewWriter(out)
	defer w.Flush()
	names := contract.FeatureNames()
	projected := ""
	if cfg.PredictWindow > 0 {
		projected = "," + infer.ProjectionName
	}
	if _, err := fmt.Fprintf(w, "time,%s%s\n", strings.Join(names[:], ","), projected); err != nil {
		return err
	}
	row := make([]byte, 0, 256)
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			return w.Flush()
		}
		if err != nil {
			return csvError(err)
		}
		line, _ := r.FieldPos(0)
		s, timeText, err := parseRawSample(line, rec, idx)
		if err != nil {
			return err
		}
		if err := eng.Add(s); err != nil {
			return &InputError{Line: line, Column: "time", Err: fmt.Errorf("time %s is not after the previous row's: rows must be in increasing time order", timeText)}
		}
		v, err := eng.Eval(s.T)
		if err != nil {
			return &InputError{Line: line, Column: "time", Err: err}
		}
		row = append(row[:0], timeText...)
		row = appendFeatures(row, &v)
		if cfg.PredictWindow > 0 {
			row = append(row, ',')
			if v.Projection.Why == infer.Defined {
				row = strconv.AppendFloat(row, v.Projection.MemoryPercent, 'g', -1, 64)
			}
		}
		row = append(row, '\n')
		if _, err := w.Write(row); err != nil {
			return err
		}
	}
}

// appendFeatures appends ",f1,...,f6" with undefined values as empty fields and
// defined ones in the shortest form that parses back to the same float64.
func appendFeatures(dst []byte, v *infer.Vector) []byte {
	for i, x := range v.Values {
		dst = append(dst, ',')
		if v.Why[i] == infer.Defined {
			dst = strconv.AppendFloat(dst, x, 'g', -1, 64)
		}
	}
	return dst
}

func parseRawSample(line int, rec []string, idx []int) (infer.Sample, string, error) {
	timeText := strings.TrimSpace(rec[idx[0]])
	if timeText == "" {
		return infer.Sample{}, "", &InputError{Line: line, Column: "time", Err: errors.New("empty time")}
	}
	secs, err := parseFinite(timeText)
	if err != nil {
		return infer.Sample{}, "", &InputError{Line: line, Column: "time", Err: err}
	}
	if secs < 0 || secs > math.MaxInt64/1e3 {
		return infer.Sample{}, "", &InputError{Line: line, Column: "time", Err: fmt.Errorf("time %q is not a Unix time in seconds", timeText)}
	}
	var vals [5]float64
	for i := range vals {
		col := replayColumns[i+1]
		f := strings.TrimSpace(rec[idx[i+1]])
		if f == "" {
			vals[i] = math.NaN()
			continue
		}
		if vals[i], err = parseFinite(f); err != nil {
			return infer.Sample{}, "", &InputError{Line: line, Column: col, Err: err}
		}
		// Counters and gauges of a cgroup are never negative; a negative
		// one is a broken export, not a load (it gave memory_percent -1.91).
		if vals[i] < 0 {
			return infer.Sample{}, "", &InputError{Line: line, Column: col, Err: fmt.Errorf("%q is negative: %s is a count of seconds or bytes", f, col)}
		}
	}
	return infer.Sample{
		T:                int64(math.Round(secs * 1e3)),
		CPUSeconds:       vals[0],
		MemoryBytes:      vals[1],
		MemoryLimitBytes: vals[2],
		NetworkBytes:     vals[3],
		DiskBytes:        vals[4],
	}, timeText, nil
}

func parseFinite(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a finite number", s)
	}
	return f, nil
}

// columnIndex maps each wanted column to its position in header.
func columnIndex(header, want []string) ([]int, error) {
	pos := make(map[string]int, len(header))
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if _, dup := pos[h]; dup {
			return nil, fmt.Errorf("column %q appears twice in the header", h)
		}
		pos[h] = i
	}
	idx := make([]int, len(want))
	var missing []string
	for i, name := range want {
		p, ok := pos[name]
		if !ok {
			missing = append(missing, name)
		}
		idx[i] = p
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("missing column(s) %s in header; expected %s", strings.Join(missing, ","), strings.Join(want, ","))
	}
	return idx, nil
}

// csvError turns an encoding/csv error into an InputError with its line.
func csvError(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &InputError{Line: pe.Line, Err: pe.Err}
	}
	return fmt.Errorf("read input: %w", err)
}
