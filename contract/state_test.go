package contract

import (
	"strings"
	"testing"
	"time"
)

func TestAHandoverReadsBackAsWritten(t *testing.T) {
	h := Handover{From: "broker", Pod: "broker-standby-7d9f-x2", Kind: StateFinal, At: time.Date(2026, 12, 6, 12, 0, 0, 5e8, time.UTC)}
	got, err := ParseHandover(h.String())
	if err != nil {
		t.Fatal(err)
	}
	if !got.At.Equal(h.At) || got.From != h.From || got.Pod != h.Pod || got.Kind != h.Kind {
		t.Fatalf("read %+v, wrote %+v", got, h)
	}
}

func TestAMalformedHandoverIsRefusedWithTheReason(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{`, "unexpected end"},
		{`{"from":"a","pod":"b","kind":"whole","at":"2026-12-06T12:00:00Z"}`, `kind "whole"`},
		{`{"from":"A_b","pod":"b","kind":"final","at":"2026-12-06T12:00:00Z"}`, `from "A_b"`},
		{`{"from":"a","pod":"","kind":"snapshot","at":"2026-12-06T12:00:00Z"}`, `pod ""`},
		{`{"from":"a","pod":"b","kind":"final"}`, "no time"},
	} {
		_, err := ParseHandover(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), AnnHandover) {
			t.Errorf("ParseHandover(%s) = %v, want an error naming %s and saying %q", tc.in, err, AnnHandover, tc.want)
		}
	}
}
