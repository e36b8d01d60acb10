package healthcheck

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/amf-edge/amf/podsignal"
)

// FuzzParseAppReport checks the POST /signal body parser never panics, refuses
// with ErrInvalidReport only, and accepts nothing the contract forbids. The
// corpus lives in testdata/fuzz/FuzzParseAppReport.
func FuzzParseAppReport(f *testing.F) {
	for _, s := range []string{
		`{"state":"unhealthy","reason":"message store full"}`,
		`{"state":"healthy"}`,
		`{"reason":"","state":"healthy"}`,
		`{"state":"anomalous"}`,
		`{"state":"healthy","state":"unhealthy"}`,
		`{"State":"healthy"}`,
		`{"state":null}`,
		`{"state":"healthy","extra":1}`,
		`{"state":"unhealthy","reason":"\u0007"}`,
		`{"state":"unhealthy","reason":"\ud800"}`,
		`{"state":"healthy"} {}`,
		` {"state" : "healthy" } `,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rep, err := parseAppReport(body)
		if err != nil {
			if !errors.Is(err, ErrInvalidReport) {
				t.Fatalf("error %v does not wrap ErrInvalidReport", err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("error text is not valid UTF-8: %q", err.Error())
			}
			return
		}
		if len(body) > MaxAppReportBytes || !utf8.Valid(body) {
			t.Fatalf("accepted a body of %d bytes / invalid UTF-8", len(body))
		}
		if rep.State != podsignal.Healthy && rep.State != podsignal.Unhealthy {
			t.Fatalf("accepted state %q", rep.State)
		}
		if err := rep.Validate(); err != nil {
			t.Fatalf("accepted report fails Validate: %v", err)
		}
		// What was accepted survives a round trip through a standard encoder.
		again, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		rep2, err := parseAppReport(again)
		if err != nil || rep2 != rep {
			t.Fatalf("round trip of %+v: %+v, %v", rep, rep2, err)
		}
	})
}

func TestTruncate(t *testing.T) {
	long := "ü" + string(make([]byte, 100))
	for _, s := range []string{"short", long, "aaa" + string([]rune{'€'})} {
		if got := truncate(s); !utf8.ValidString(got) || len(got) > 64+len("…") {
			t.Errorf("truncate(%q) = %q", s, got)
		}
	}
}
