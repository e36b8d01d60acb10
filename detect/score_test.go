package detect

import (
	"bytes"
	"encoding/csv"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/infer/model/modeltest"
)

const featHeader = "pod,cpu_percent,memory_percent,network_io_bytes_per_sec,disk_io_bytes_per_sec,cpu_growth_rate,memory_growth_rate"

func p1Model(t *testing.T) *model.Model { return modeltest.P1(t) }

func TestScoreCSVAppendsProbabilityAndVerdict(t *testing.T) {
	m := p1Model(t)
	in := featHeader + "\r\n" +
		"calm,0.3,8,996,57,9e-8,1.5\r\n" +
		"hot,190,40,996,57,0.01,100\r\n" +
		"gaps,0.3,8,,,,\r\n"
	var out bytes.Buffer
	if err := ScoreCSV(strings.NewReader(in), &out, m); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rows[0], ","); got != featHeader+",probability,anomaly" {
		t.Fatalf("header %q", got)
	}
	want := map[string]string{"calm": "0", "hot": "1"}
	for _, r := range rows[1:] {
		p, err := strconv.ParseFloat(r[7], 64)
		if err != nil || p < 0 || p > 1 {
			t.Fatalf("row %v: probability %q", r, r[7])
		}
		// The Go scorer must agree with a direct call: empty fields are NaN.
		var x [6]float64
		for i := range x {
			if x[i], err = strconv.ParseFloat(r[1+i], 64); err != nil {
				x[i] = math.NaN()
			}
		}
		if direct := m.Score(&x); direct != p {
			t.Fatalf("row %s: CSV probability %v, direct score %v", r[0], p, direct)
		}
		if w, ok := want[r[0]]; ok && r[8] != w {
			t.Errorf("row %s: anomaly %s, want %s (p=%v)", r[0], r[8], w, p)
		}
	}
}

func TestScoreCSVRejectsBadInput(t *testing.T) {
	m := p1Model(t)
	tests := []struct {
		name, in, mention string
		line              int
	}{
		{"missing feature column", "cpu_percent,memory_percent\n1,2\n", "network_io_bytes_per_sec", 1},
		{"non-numeric feature", featHeader + "\na,1,2,3,4,5,6\nb,1,x,3,4,5,6\n", `column memory_percent: "x"`, 3},
		{"infinite feature", featHeader + "\na,1,2,3,4,5,Inf\n", "finite", 2},
		{"empty input", "", "header", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ScoreCSV(strings.NewReader(tt.in), &bytes.Buffer{}, m)
			var ie *InputError
			if !errors.As(err, &ie) || ie.Line != tt.line || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v, want line %d mentioning %q", err, tt.line, tt.mention)
			}
		})
	}
}

// The dataset files, as they are (CRLF, empty fields), must score end to end.
func TestScoreCSVOnTheDataset(t *testing.T) {
	dir := filepath.Join("..", "..", "shared", "data", "tod-k8s-ood", "data")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("ToD-K8s-OOD dataset not at %s (it lives beside the repository in ../shared)", dir)
	}
	m := p1Model(t)
	for _, name := range []string{"D_nominal.csv", "D_stressed.csv"} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = ScoreCSV(f, &out, m)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := strings.Count(out.String(), "\n"); n != 12970 {
			t.Fatalf("%s: %d lines out, want 12,969 rows + header", name, n)
		}
	}
}

func TestScoreCSVScoresThePredictLinearProjection(t *testing.T) {
	m, err := model.Embedded(model.PredictLinearName)
	if err != nil {
		t.Fatal(err)
	}
	in := featHeader + ",memory_percent_projected\n" +
		"young,0.3,8,,,,,\n" +
		"below,0.3,8,,,,,50\n" +
		"at,0.3,8,,,,,100\n"
	var out bytes.Buffer
	if err := ScoreCSV(strings.NewReader(in), &out, m); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]string{{"0", "0"}, {strconv.FormatFloat(0.5/1.5, 'g', -1, 64), "0"}, {"0.5", "1"}}
	for i, w := range want {
		r := rows[i+1]
		if got := [2]string{r[len(r)-2], r[len(r)-1]}; got != w {
			t.Errorf("row %s: score, anomaly %v, want %v", r[0], got, w)
		}
	}
	// Without the projection the rule cannot score: refused, naming the column.
	err = ScoreCSV(strings.NewReader(featHeader+"\nx,1,1,1,1,1,1\n"), &bytes.Buffer{}, m)
	var ie *InputError
	if !errors.As(err, &ie) || ie.Line != 1 || !strings.Contains(err.Error(), "memory_percent_projected") {
		t.Fatalf("error %v; want an InputError at line 1 naming the projection column", err)
	}
}
