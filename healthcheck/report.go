package healthcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/amf-edge/amf/podsignal"
)

// MaxAppReportBytes caps the body of POST /signal; a valid report is far smaller.
const MaxAppReportBytes = 1 << 10

// AppReport is the application's own statement about its health, received on
// POST /signal as {"state":"unhealthy","reason":"..."}.
//
// Only podsignal.Healthy and podsignal.Unhealthy are accepted: the application can
// vouch for its own logic working or not, and nothing else. Anomalous is the
// model's verdict on telemetry the sidecar measures; starting and stopping
// describe the sidecar's lifecycle; gone is the agent's conclusion from a lost
// connection. Letting the application claim those would let a confused or
// compromised process mask or forge the sidecar's own verdicts.
type AppReport struct {
	State  podsignal.State `json:"state"`
	Reason string          `json:"reason,omitempty"`
}

// Errors an [ServerConfig.OnAppReport] callback returns to refuse a report,
// checked with errors.Is; any other error is answered with 503.
var (
	// ErrConflict: the report is valid but cannot apply in the current state,
	// e.g. the sidecar is stopping. Answered with 409.
	ErrConflict = errors.New("report conflicts with the sidecar's state")
	// ErrInvalidReport: the report is malformed or not allowed. Answered with 400.
	ErrInvalidReport = errors.New("invalid report")
)

// parseAppReport decodes a POST /signal body strictly: one JSON object with a
// string "state" and an optional string "reason", keys matched exactly (not
// case-insensitively as encoding/json would), no duplicate or unknown keys, no
// trailing data, valid UTF-8 throughout (encoding/json would quietly replace
// invalid bytes). Duplicates are refused because parsers disagree on which one
// wins.
func parseAppReport(body []byte) (AppReport, error) {
	if len(body) > MaxAppReportBytes {
		return AppReport{}, fmt.Errorf("%w: body of %d bytes, at most %d", ErrInvalidReport, len(body), MaxAppReportBytes)
	}
	if !utf8.Valid(body) {
		return AppReport{}, fmt.Errorf("%w: body is not valid UTF-8", ErrInvalidReport)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return AppReport{}, fmt.Errorf("%w: want a JSON object", ErrInvalidReport)
	}
	var (
		rep      AppReport
		hasState bool
		seen     = map[string]bool{}
	)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return AppReport{}, fmt.Errorf("%w: %v", ErrInvalidReport, err)
		}
		key, _ := tok.(string) // inside an object, Token returns keys as strings
		if seen[key] {
			return AppReport{}, fmt.Errorf("%w: duplicate field %q", ErrInvalidReport, truncate(key))
		}
		seen[key] = true
		var dst *string
		switch key {
		case "state":
			dst, hasState = (*string)(&rep.State), true
		case "reason":
			dst = &rep.Reason
		default:
			return AppReport{}, fmt.Errorf("%w: unknown field %q", ErrInvalidReport, truncate(key))
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return AppReport{}, fmt.Errorf("%w: field %q: %v", ErrInvalidReport, key, err)
		}
		// Decoding null into a string is a silent no-op in encoding/json; only a
		// JSON string is a string here.
		if len(raw) == 0 || raw[0] != '"' {
			return AppReport{}, fmt.Errorf("%w: field %q must be a string", ErrInvalidReport, key)
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return AppReport{}, fmt.Errorf("%w: field %q: %v", ErrInvalidReport, key, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return AppReport{}, fmt.Errorf("%w: %v", ErrInvalidReport, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return AppReport{}, fmt.Errorf("%w: trailing data after the JSON object", ErrInvalidReport)
	}
	if !hasState {
		return AppReport{}, fmt.Errorf("%w: missing field \"state\"", ErrInvalidReport)
	}
	if err := rep.Validate(); err != nil {
		return AppReport{}, err
	}
	return rep, nil
}

// Validate checks the state and reason rules of a report.
func (r AppReport) Validate() error {
	if r.State != podsignal.Healthy && r.State != podsignal.Unhealthy {
		return fmt.Errorf("%w: state %q: the application may report only %q or %q", ErrInvalidReport, truncate(string(r.State)), podsignal.Healthy, podsignal.Unhealthy)
	}
	// The same rule as podsignal.Message's reason, so the sidecar can forward it.
	if len(r.Reason) > podsignal.MaxReasonBytes {
		return fmt.Errorf("%w: reason of %d bytes, at most %d", ErrInvalidReport, len(r.Reason), podsignal.MaxReasonBytes)
	}
	if !utf8.ValidString(r.Reason) || strings.ContainsFunc(r.Reason, unicode.IsControl) {
		return fmt.Errorf("%w: reason must be printable UTF-8", ErrInvalidReport)
	}
	return nil
}

// truncate keeps hostile input out of error messages and logs at full length.
func truncate(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	// Cut on a rune boundary so the result stays valid UTF-8.
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
