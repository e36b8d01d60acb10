package podsignal

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func ptr(f float64) *float64 { return &f }

func validMessage() Message {
	return Message{
		Version:          Version,
		Namespace:        "tod",
		Pod:              "broker-7f57c8d79b-f2m5m",
		State:            Anomalous,
		Probability:      ptr(0.93),
		Features:         &Features{CPUPercent: ptr(81.5), MemoryPercent: ptr(62), CPUGrowthRate: nil},
		Seq:              42,
		Time:             time.Date(2026, 11, 30, 4, 30, 0, 123456789, time.UTC),
		Reason:           "score 0.93 >= 0.50",
		Explanation:      "memory_growth_rate +2.31, memory_percent +0.842",
		MemoryLimitBytes: ptr(256 << 20),
		Handover:         "tod/broker-0/1",
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	m := validMessage()
	b, err := Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(Topic(m.Namespace, m.Pod), b)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != m.State || *got.Probability != *m.Probability || got.Seq != m.Seq ||
		!got.Time.Equal(m.Time) || *got.Features.CPUPercent != 81.5 || got.Features.CPUGrowthRate != nil ||
		got.MemoryLimitBytes == nil || *got.MemoryLimitBytes != 256<<20 {
		t.Fatalf("round trip changed the message:\n got %+v\nwant %+v", got, m)
	}
}

func TestDecodeRefusesWhatBreaksTheContract(t *testing.T) {
	topic := Topic("tod", "broker-1")
	ok := `"v":1,"namespace":"tod","pod":"broker-1","state":"healthy","seq":1,"time":"2026-11-30T04:30:00Z"`
	tests := []struct {
		name    string
		topic   string
		payload string
		want    error
	}{
		{"valid minimal message", topic, "{" + ok + "}", nil},
		{"unknown version", topic, strings.Replace("{"+ok+"}", `"v":1`, `"v":2`, 1), ErrInvalid},
		{"missing version", topic, strings.Replace("{"+ok+"}", `"v":1,`, ``, 1), ErrInvalid},
		{"missing seq", topic, strings.Replace("{"+ok+"}", `"seq":1,`, ``, 1), ErrInvalid},
		{"missing time", topic, strings.Replace("{"+ok+"}", `,"time":"2026-11-30T04:30:00Z"`, ``, 1), ErrInvalid},
		{"unknown state", topic, strings.Replace("{"+ok+"}", `healthy`, `fine`, 1), ErrInvalid},
		{"unknown field", topic, "{" + ok + `,"extra":1}`, ErrInvalid},
		{"NaN probability as string", topic, "{" + ok + `,"probability":"NaN"}`, ErrInvalid},
		{"probability above 1", topic, "{" + ok + `,"probability":1.5}`, ErrInvalid},
		{"memory limit of a resized container", topic, "{" + ok + `,"memory_limit_bytes":402653184}`, nil},
		{"memory limit zero", topic, "{" + ok + `,"memory_limit_bytes":0}`, ErrInvalid},
		{"memory limit negative", topic, "{" + ok + `,"memory_limit_bytes":-1}`, ErrInvalid},
		{"memory climbing at 1 MiB/s", topic, "{" + ok + `,"memory_slope_bytes_per_second":1048576}`, nil},
		{"memory falling", topic, "{" + ok + `,"memory_slope_bytes_per_second":-4096.5}`, nil},
		{"memory slope not a number", topic, "{" + ok + `,"memory_slope_bytes_per_second":"fast"}`, ErrInvalid},
		{"unknown feature", topic, "{" + ok + `,"features":{"gpu":1}}`, ErrInvalid},
		{"null feature is undefined, not an error", topic, "{" + ok + `,"features":{"cpu_percent":null}}`, nil},
		{"oversize", topic, "{" + ok + `,"reason":"` + strings.Repeat("x", MaxMessageBytes) + `"}`, ErrTooLarge},
		{"reason too long", topic, "{" + ok + `,"reason":"` + strings.Repeat("x", MaxReasonBytes+1) + `"}`, ErrInvalid},
		{"handover too long", topic, "{" + ok + `,"handover":"` + strings.Repeat("x", MaxHandoverBytes+1) + `"}`, ErrInvalid},
		{"explanation too long", topic, "{" + ok + `,"explanation":"` + strings.Repeat("x", MaxExplanationBytes+1) + `"}`, ErrInvalid},
		{"explanation with a control character", topic, "{" + ok + `,"explanation":"a\nb"}`, ErrInvalid},
		{"control character in reason", topic, "{" + ok + `,"reason":"a\u0001b"}`, ErrInvalid},
		{"trailing data", topic, "{" + ok + "} {}", ErrInvalid},
		{"not JSON", topic, "healthy", ErrInvalid},
		{"payload names another pod", Topic("tod", "broker-2"), "{" + ok + "}", ErrIdentity},
		{"payload names another namespace", Topic("other", "broker-1"), "{" + ok + "}", ErrIdentity},
		{"topic with a wildcard", "amf/v1/tod/+/health", "{" + ok + "}", ErrTopic},
		{"topic of another kind", "amf/v1/tod/broker-1/metrics", "{" + ok + "}", ErrTopic},
		{"topic of another version", "amf/v2/tod/broker-1/health", "{" + ok + "}", ErrTopic},
		{"upper-case pod name", Topic("tod", "Broker"), "{" + ok + "}", ErrTopic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.topic, []byte(tt.payload))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("refused a valid message: %v", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestEncodeRefusesNonFiniteNumbers(t *testing.T) {
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		m := validMessage()
		m.Features.MemoryGrowthRate = ptr(v)
		if _, err := Encode(&m); !errors.Is(err, ErrInvalid) {
			t.Errorf("feature %v: error = %v, want ErrInvalid", v, err)
		}
		m = validMessage()
		m.Probability = ptr(v)
		if _, err := Encode(&m); !errors.Is(err, ErrInvalid) {
			t.Errorf("probability %v: error = %v, want ErrInvalid", v, err)
		}
	}
}

func TestAFullMessageFitsTheLimit(t *testing.T) {
	// The longest names, every feature at its longest float and the longest reason
	// must still encode: the sidecar must never produce a message the agent refuses.
	long := -1.2345678901234567e-300
	m := Message{
		Version: Version, Namespace: strings.Repeat("n", 63), Pod: strings.Repeat(strings.Repeat("p", 63)+".", 3) + strings.Repeat("p", 61),
		State: Unhealthy, Probability: ptr(0.12345678901234567), Seq: math.MaxUint64, Time: time.Now(),
		Features:         &Features{ptr(long), ptr(long), ptr(long), ptr(long), ptr(long), ptr(long)},
		MemoryLimitBytes: ptr(1.2345678901234567e300),
	}
	for _, worst := range []string{"\u2028", "<", `"`, `\`} {
		m.Reason = strings.Repeat(worst, MaxReasonBytes/len(worst))
		m.Explanation = strings.Repeat(worst, MaxExplanationBytes/len(worst))
		m.Handover = strings.Repeat(worst, MaxHandoverBytes/len(worst))
		if _, err := Encode(&m); err != nil {
			t.Errorf("reason of %q: %v", worst, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	m := validMessage()
	b, _ := Encode(&m)
	f.Add(Topic(m.Namespace, m.Pod), b)
	f.Add("amf/v1/a/b/health", []byte(`{"v":1,"namespace":"a","pod":"b","state":"gone","seq":0,"time":"2026-01-01T00:00:00Z"}`))
	f.Add("amf/v1/a/b/health", []byte(`{"v":1,"features":{"cpu_percent":1e999}}`))
	f.Add("amf/v1/a/b/health", []byte(`{"v":1,"namespace":"a","pod":"b","state":"gone","seq":0,"time":"2026-01-01T00:00:00Z","reason":"\ud83d\ude00\\ud800"}`))
	f.Add("amf/v1/a/b/health", []byte(`{"v":1,"namespace":"a","pod":"b","state":"anomalous","seq":3,"time":"2026-01-01T00:00:00Z","memory_limit_bytes":104857600,"memory_slope_bytes_per_second":1048576}`))
	f.Fuzz(func(t *testing.T, topic string, payload []byte) {
		got, err := Decode(topic, payload)
		if err != nil {
			return
		}
		// What is accepted is what the broker retains and forwards: its
		// bytes must be UTF-8, not only its decoded strings.
		if !utf8.Valid(payload) {
			t.Fatalf("accepted a payload that is not UTF-8: %q", payload)
		}
		// Whatever is accepted must be valid and must survive a round trip.
		if err := got.Validate(); err != nil {
			t.Fatalf("accepted an invalid message: %v", err)
		}
		b, err := Encode(&got)
		if err != nil {
			t.Fatalf("accepted message does not re-encode: %v", err)
		}
		if _, err := Decode(topic, b); err != nil {
			t.Fatalf("re-encoded message refused: %v", err)
		}
	})
}

func TestShortReasonFitsTheLimitAtARuneBoundary(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		cut      bool
	}{
		{"short is kept", "probe failed", false},
		{"exactly the limit is kept", strings.Repeat("a", MaxReasonBytes), false},
		{"ASCII over the limit is cut", strings.Repeat("a", MaxReasonBytes+1), true},
		{"multi-byte runes are not split", strings.Repeat("é", MaxReasonBytes), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ShortReason(tc.in)
			if len(got) > MaxReasonBytes || !utf8.ValidString(got) {
				t.Fatalf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
			if cut := got != tc.in; cut != tc.cut || (cut && !strings.HasSuffix(got, "…")) {
				t.Errorf("cut %v (%q...), want cut %v ending in …", cut, got[:min(len(got), 20)], tc.cut)
			}
			m := validMessage()
			m.Reason = got
			if err := m.Validate(); err != nil {
				t.Errorf("the shortened reason is refused: %v", err)
			}
		})
	}
}

// encoding/json turns bytes that are not UTF-8, and escapes of unpaired
// surrogates, into U+FFFD before any validation sees the strings, while the
// broker would retain and forward the original bytes: the raw payload is
// checked first.
func TestDecodeChecksTheRawBytesBeforeJSONRepairsThem(t *testing.T) {
	m := validMessage()
	m.Reason = "REASON"
	b, err := Encode(&m)
	if err != nil {
		t.Fatal(err)
	}
	topic := Topic(m.Namespace, m.Pod)
	for _, tc := range []struct {
		name, reason string
		ok           bool
		want         string // the decoded reason, when ok
	}{
		{"bytes ff fe", "a\xff\xfeb", false, ""},
		{"a truncated rune", "caf\xc3", false, ""},
		{"an overlong encoding", "\xc0\xaf", false, ""},
		{"a lone high surrogate", `\ud800`, false, ""},
		{"a lone low surrogate", `\udc00x`, false, ""},
		{"a high surrogate before a non-surrogate", `\ud800\u0041`, false, ""},
		{"a high surrogate at the end of the string", `x\uD83D`, false, ""},
		{"a surrogate pair", `\ud83d\ude00`, true, "😀"},
		{"U+FFFD itself", "\uFFFD", true, "\uFFFD"},
		{"U+FFFD escaped", `\ufffd`, true, "\uFFFD"},
		{"an escaped backslash before ud800", `\\ud800`, true, `\ud800`},
		{"plain UTF-8", "Zürich → 3 °C", true, "Zürich → 3 °C"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			payload := []byte(strings.Replace(string(b), "REASON", tc.reason, 1))
			got, err := Decode(topic, payload)
			if !tc.ok {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Decode(%q) = %q, %v; want ErrInvalid", payload, got.Reason, err)
				}
				return
			}
			if err != nil || got.Reason != tc.want {
				t.Fatalf("Decode = %q, %v; want %q", got.Reason, err, tc.want)
			}
		})
	}
}
