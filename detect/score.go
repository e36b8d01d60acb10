package detect

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
	"github.com/amf-edge/amf/infer/model"
)

// ScoreCSV reads rows with the six feature columns (any order; other columns are
// passed through, so the dataset files work as they are) and writes each row with
// `probability` and `anomaly` (0/1 at the model's threshold) appended. Features are
// taken on the model's scale, as in its training data. An empty (or NaN) feature is
// a missing value and follows the model's missing-value path. On bad input it stops
// at the bad line with an *InputError; rows before it have been written. The
// predict_linear detector scores the projection column (infer.ProjectionName, as
// replay writes it for that model) and needs it.
func ScoreCSV(in io.Reader, out io.Writer, m *model.Model) error {
	r := csv.NewReader(in)
	header, err := r.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return &InputError{Line: 1, Err: errors.New("empty input: expected a header with the six feature columns")}
		}
		return csvError(err)
	}
	names := contract.FeatureNames()
	want := names[:]
	if m.Rule() != "" {
		want = append(want[:len(want):len(want)], infer.ProjectionName)
	}
	idx, err := columnIndex(header, want)
	if err != nil {
		return &InputError{Line: 1, Err: err}
	}
	w := csv.NewWriter(out)
	if err := w.Write(append(header[:len(header):len(header)], "probability", "anomaly")); err != nil {
		return err
	}
	var x [contract.NumFeatures]float64
	projected := math.NaN()
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			w.Flush()
			return w.Error()
		}
		if err != nil {
			w.Flush()
			return errors.Join(csvError(err), w.Error())
		}
		line, _ := r.FieldPos(0)
		for i, col := range idx {
			f := strings.TrimSpace(rec[col])
			v := math.NaN()
			if f != "" && !strings.EqualFold(f, "nan") {
				if v, err = parseFinite(f); err != nil {
					w.Flush()
					return errors.Join(&InputError{Line: line, Column: want[i], Err: err}, w.Error())
				}
			}
			if i < contract.NumFeatures {
				x[i] = v
			} else {
				projected = v
			}
		}
		p := m.ScoreSample(&x, projected)
		anomaly := "0"
		if m.Anomalous(p) {
			anomaly = "1"
		}
		if err := w.Write(append(rec, strconv.FormatFloat(p, 'g', -1, 64), anomaly)); err != nil {
			return fmt.Errorf("write output: %w", err)
		}
	}
}
