// Package podsignal is the wire contract between the sidecar and the node
// agent: the MQTT topic of a pod's health, the JSON message on it, its size
// limit and its validation. Both sides import it; it imports neither. (Named
// for what it carries, a pod's signal, and so that it does not shadow
// os/signal in the commands that import both.)
package podsignal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/amf-edge/amf/contract"
)

// Version is the message schema version this package reads and writes.
const Version = 1

// MaxMessageBytes bounds a payload: anything larger is refused before parsing.
const MaxMessageBytes = 4 << 10

// MaxReasonBytes bounds the free-text reason, so a message always fits.
const MaxReasonBytes = 512

// MaxExplanationBytes bounds the explanation: three features with their
// contributions ("memory_growth_rate +2.31, memory_percent +0.842,
// cpu_growth_rate +0.125") take about 70 bytes, predict_linear's time to the
// limit fewer.
const MaxExplanationBytes = 256

// ShortReason cuts a reason to MaxReasonBytes at a UTF-8 boundary, ending it
// with "…" when cut: a long reason (a discovery error naming every cgroup it
// looked at) must shorten the signal, not stop it.
func ShortReason(r string) string { return shorten(r, MaxReasonBytes) }

// ShortExplanation cuts an explanation to MaxExplanationBytes as ShortReason
// cuts a reason.
func ShortExplanation(e string) string { return shorten(e, MaxExplanationBytes) }

func shorten(r string, limit int) string {
	if len(r) <= limit {
		return r
	}
	const ell = "…"
	cut := limit - len(ell)
	for cut > 0 && !utf8.RuneStart(r[cut]) {
		cut--
	}
	return r[:cut] + ell
}

// TopicPrefix starts every health topic.
const TopicPrefix = "amf/v1/"

// State is a pod's health as the sidecar sees it.
type State string

// The states of the contract.
const (
	Starting  State = "starting"  // sidecar up, no verdict yet
	Healthy   State = "healthy"   // score below threshold, app-logic probe passing
	Anomalous State = "anomalous" // score at or above threshold: trouble is coming
	Unhealthy State = "unhealthy" // app-logic probe failing or the app said so: trouble is here
	Stopping  State = "stopping"  // orderly shutdown (SIGTERM)
	Gone      State = "gone"      // sidecar disconnected without saying goodbye (Last Will)
)

// Valid reports whether s is one of the contract's states.
func (s State) Valid() bool {
	switch s {
	case Starting, Healthy, Anomalous, Unhealthy, Stopping, Gone:
		return true
	}
	return false
}

// Features are the six model inputs; nil means undefined at that sample.
type Features struct {
	CPUPercent           *float64 `json:"cpu_percent"`
	MemoryPercent        *float64 `json:"memory_percent"`
	NetworkIOBytesPerSec *float64 `json:"network_io_bytes_per_sec"`
	DiskIOBytesPerSec    *float64 `json:"disk_io_bytes_per_sec"`
	CPUGrowthRate        *float64 `json:"cpu_growth_rate"`
	MemoryGrowthRate     *float64 `json:"memory_growth_rate"`
}

// Message is one health signal.
type Message struct {
	Version     int       `json:"v"`
	Namespace   string    `json:"namespace"`
	Pod         string    `json:"pod"`
	State       State     `json:"state"`
	Probability *float64  `json:"probability,omitempty"` // model score, absent before the first score
	Features    *Features `json:"features,omitempty"`
	Seq         uint64    `json:"seq"`  // sample sequence number, increasing per sidecar run
	Time        time.Time `json:"time"` // when the sample was taken
	Reason      string    `json:"reason,omitempty"`
	// Explanation says what drove the score when it is anomalous: the top
	// features by contribution, or predict_linear's time to the limit
	// (model.Model.Why); absent otherwise. An agent older than this field
	// refuses messages that carry it (unknown fields are refused), so
	// agents are upgraded before sidecars.
	Explanation string `json:"explanation,omitempty"`
	// MemoryLimitBytes is the broker container's memory limit as the
	// sidecar read it from the container's cgroup with this sample (what
	// memory_percent is a percent of); absent when the container has no
	// limit of its own. The agent confirms an in-place resize by it: the
	// kubelet's status says the runtime was asked, this says the cgroup
	// has it. Same upgrade rule as Explanation.
	MemoryLimitBytes *float64 `json:"memory_limit_bytes,omitempty"`
	// MemorySlopeBytesPerSecond is the memory's current slope, bytes per
	// second: the median of the steps between its samples of the last 6 s
	// (infer.Vector.MemorySlope); absent with fewer than three steps. The
	// agent judges by it whether a resize in place answers a memory
	// anomaly (a step that has stopped) or only postpones it (a leak that
	// goes on). Same upgrade rule as Explanation.
	MemorySlopeBytesPerSecond *float64 `json:"memory_slope_bytes_per_second,omitempty"`
	// Handover names the broker state (a state hub's ID) that the sidecar
	// restarted its broker on, in every message after that restart: the
	// agent holds a stateful pod out of its Services until a healthy
	// message names the state it was handed. Same upgrade rule as
	// Explanation.
	Handover string `json:"handover,omitempty"`
}

// MaxHandoverBytes bounds Message.Handover.
const MaxHandoverBytes = 128

// Errors a decoder returns, to be checked with errors.Is.
var (
	ErrTooLarge = errors.New("signal: message larger than 4 KiB")
	ErrInvalid  = errors.New("signal: invalid message")
	ErrIdentity = errors.New("signal: topic and payload name different pods")
	ErrTopic    = errors.New("signal: not a health topic")
)

// Topic returns the health topic of a pod.
func Topic(namespace, pod string) string {
	return TopicPrefix + namespace + "/" + pod + "/health"
}

// ParseTopic returns the namespace and pod of a health topic.
func ParseTopic(topic string) (namespace, pod string, err error) {
	rest, ok := strings.CutPrefix(topic, TopicPrefix)
	if !ok {
		return "", "", fmt.Errorf("%w: %q does not start with %q", ErrTopic, truncate(topic), TopicPrefix)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[2] != "health" {
		return "", "", fmt.Errorf("%w: %q is not %s<namespace>/<pod>/health", ErrTopic, truncate(topic), TopicPrefix)
	}
	if err := ValidateNames(parts[0], parts[1]); err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrTopic, err)
	}
	return parts[0], parts[1], nil
}

// ValidateNames checks a namespace (DNS-1123 label) and pod name (DNS-1123
// subdomain), which also keeps MQTT wildcards and separators out of topics.
func ValidateNames(namespace, pod string) error {
	if !isDNSLabel(namespace, 63) {
		return fmt.Errorf("namespace %q is not a DNS-1123 label", truncate(namespace))
	}
	if !isDNSSubdomain(pod) {
		return fmt.Errorf("pod name %q is not a DNS-1123 subdomain", truncate(pod))
	}
	return nil
}

// Validate checks every rule of the contract.
func (m *Message) Validate() error {
	if m.Version != Version {
		return fmt.Errorf("%w: version %d, this build reads version %d", ErrInvalid, m.Version, Version)
	}
	if err := ValidateNames(m.Namespace, m.Pod); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !m.State.Valid() {
		return fmt.Errorf("%w: unknown state %q", ErrInvalid, truncate(string(m.State)))
	}
	if m.Time.IsZero() {
		return fmt.Errorf("%w: missing time", ErrInvalid)
	}
	if p := m.Probability; p != nil && !(*p >= 0 && *p <= 1) {
		return fmt.Errorf("%w: probability %v is not in [0, 1]", ErrInvalid, *p)
	}
	if f := m.Features; f != nil {
		for i, v := range f.Values() {
			if v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
				return fmt.Errorf("%w: feature %s is %v, want a finite number or null", ErrInvalid, contract.FeatureNames()[i], *v)
			}
		}
	}
	if l := m.MemoryLimitBytes; l != nil && !(*l > 0 && !math.IsInf(*l, 0)) {
		return fmt.Errorf("%w: memory_limit_bytes %v, want a positive finite number or none", ErrInvalid, *l)
	}
	if v := m.MemorySlopeBytesPerSecond; v != nil && (math.IsNaN(*v) || math.IsInf(*v, 0)) {
		return fmt.Errorf("%w: memory_slope_bytes_per_second %v, want a finite number or none", ErrInvalid, *v)
	}
	if len(m.Reason) > MaxReasonBytes {
		return fmt.Errorf("%w: reason of %d bytes, at most %d", ErrInvalid, len(m.Reason), MaxReasonBytes)
	}
	// Printable UTF-8 only: keeps logs clean and bounds the escaped size (at most
	// 2 bytes of JSON per byte of reason), so a valid message always fits.
	if !printable(m.Reason) {
		return fmt.Errorf("%w: reason must be printable UTF-8", ErrInvalid)
	}
	if len(m.Explanation) > MaxExplanationBytes {
		return fmt.Errorf("%w: explanation of %d bytes, at most %d", ErrInvalid, len(m.Explanation), MaxExplanationBytes)
	}
	if !printable(m.Explanation) {
		return fmt.Errorf("%w: explanation must be printable UTF-8", ErrInvalid)
	}
	if len(m.Handover) > MaxHandoverBytes || !printable(m.Handover) {
		return fmt.Errorf("%w: handover of %d bytes, want at most %d of printable UTF-8", ErrInvalid, len(m.Handover), MaxHandoverBytes)
	}
	return nil
}

func printable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

// Values returns the features in the model's input order, that of
// contract.FeatureNames (which the JSON names equal: TestFeaturesJSONNames).
func (f *Features) Values() [contract.NumFeatures]*float64 {
	return [contract.NumFeatures]*float64{f.CPUPercent, f.MemoryPercent, f.NetworkIOBytesPerSec, f.DiskIOBytesPerSec, f.CPUGrowthRate, f.MemoryGrowthRate}
}

// Encode validates m and returns its payload.
func Encode(m *Message) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // '<' as \u003c would triple a reason's size
	if err := enc.Encode(m); err != nil {
		return nil, fmt.Errorf("signal: encode: %w", err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(b))
	}
	return b, nil
}

// Decode parses and validates a payload received on topic. Unknown fields, missing
// required fields, non-finite numbers, oversize payloads and a payload naming
// another pod than its topic are all refused.
func Decode(topic string, payload []byte) (Message, error) {
	if len(payload) > MaxMessageBytes {
		return Message{}, fmt.Errorf("%w: %d bytes on %s", ErrTooLarge, len(payload), truncate(topic))
	}
	ns, pod, err := ParseTopic(topic)
	if err != nil {
		return Message{}, err
	}
	// Required fields are detected by decoding into pointers first.
	var raw struct {
		Version     *int       `json:"v"`
		Namespace   *string    `json:"namespace"`
		Pod         *string    `json:"pod"`
		State       *State     `json:"state"`
		Probability *float64   `json:"probability"`
		Features    *Features  `json:"features"`
		Seq         *uint64    `json:"seq"`
		Time        *time.Time `json:"time"`
		Reason      string     `json:"reason"`
		Explanation string     `json:"explanation"`
		MemoryLimit *float64   `json:"memory_limit_bytes"`
		MemorySlope *float64   `json:"memory_slope_bytes_per_second"`
		Handover    string     `json:"handover"`
	}
	if err := decodeStrict(payload, &raw); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for _, f := range []struct {
		name    string
		missing bool
	}{
		{"v", raw.Version == nil}, {"namespace", raw.Namespace == nil}, {"pod", raw.Pod == nil},
		{"state", raw.State == nil}, {"seq", raw.Seq == nil}, {"time", raw.Time == nil},
	} {
		if f.missing {
			return Message{}, fmt.Errorf("%w: missing field %q", ErrInvalid, f.name)
		}
	}
	m := Message{
		Version: *raw.Version, Namespace: *raw.Namespace, Pod: *raw.Pod, State: *raw.State,
		Probability: raw.Probability, Features: raw.Features, Seq: *raw.Seq, Time: *raw.Time,
		Reason: raw.Reason, Explanation: raw.Explanation, MemoryLimitBytes: raw.MemoryLimit,
		MemorySlopeBytesPerSecond: raw.MemorySlope, Handover: raw.Handover,
	}
	if err := m.Validate(); err != nil {
		return Message{}, err
	}
	if m.Namespace != ns || m.Pod != pod {
		return Message{}, fmt.Errorf("%w: topic %s/%s, payload %s/%s", ErrIdentity, ns, pod, m.Namespace, m.Pod)
	}
	return m, nil
}

// decodeStrict decodes one JSON object into v, refusing unknown fields and
// anything after the object: the contract's decoding of every payload.
func decodeStrict(payload []byte, v any) error {
	if err := checkRawText(payload); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

// checkRawText refuses what encoding/json would repair in silence: bytes
// that are not UTF-8 and \u escapes of unpaired UTF-16 surrogates both
// decode to U+FFFD, so a check of the decoded strings cannot see them,
// while the original bytes are what the broker retains and forwards.
// Outside strings a backslash is invalid JSON, so every escape seen here
// is inside one.
func checkRawText(payload []byte) error {
	if !utf8.Valid(payload) {
		i := 0
		for i < len(payload) {
			r, n := utf8.DecodeRune(payload[i:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			i += n
		}
		return fmt.Errorf("not UTF-8: invalid byte %#02x at offset %d", payload[i], i)
	}
	for i := 0; i < len(payload); i++ {
		if payload[i] != '\\' {
			continue
		}
		if i+1 >= len(payload) || payload[i+1] != 'u' {
			i++ // a two-byte escape such as \" or \\
			continue
		}
		r, ok := hex4(payload[i+2:])
		if !ok {
			return nil // malformed escape: the JSON decoder says where
		}
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00: // high: a low surrogate must follow
			lo, ok := rune(0), false
			if i+7 < len(payload) && payload[i+6] == '\\' && payload[i+7] == 'u' {
				lo, ok = hex4(payload[i+8:])
			}
			if !ok || !(lo >= 0xdc00 && lo <= 0xdfff) {
				return fmt.Errorf("unpaired UTF-16 surrogate \\u%04x at offset %d", r, i)
			}
			i += 11
		case utf16.IsSurrogate(r):
			return fmt.Errorf("unpaired UTF-16 surrogate \\u%04x at offset %d", r, i)
		default:
			i += 5
		}
	}
	return nil
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func isDNSLabel(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

func isDNSSubdomain(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if !isDNSLabel(label, 63) {
			return false
		}
	}
	return true
}

// truncate keeps hostile input out of logs at full length.
func truncate(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
