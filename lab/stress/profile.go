// Package stress is the load generator of the lab's staged fault injector: it
// holds memory and burns CPU phase by phase, as the paper's experiment does to
// the edge broker's container (60 s baseline; 120 s of ~60 MiB memory and
// ~80 % of a 500m CPU limit; 60 s of memory over the 100 MiB limit, until the
// kernel OOM-kills the container).
//
// It is lab test infrastructure: product code never imports it. It never
// touches cgroups and never takes a recovery action: the experiment runner
// starts it inside the broker container's cgroup (as `kubectl exec` would), so
// what it holds is charged to the broker's container, and an OOM kill of it is
// the expected outcome of an over-limit phase.
//
// A Profile is written as phases separated by ';', each a duration optionally
// followed by ':' and comma-separated settings:
//
//	60s;120s:mem=60Mi,cpu=0.4;60s:mem=150Mi,ramp=10Mi/s
//
//	mem=SIZE    memory held during the phase (default 0: release everything)
//	ramp=SIZE/s growth rate towards mem (default 0: all at once); lowering is immediate
//	cpu=CORES   CPU burnt, in cores (0.4, or 400m as in Kubernetes; default 0)
//
// SIZE is a number of bytes with an optional unit: Ki, Mi, Gi, Ti (powers of
// 1024, also KiB, MiB…) or k, K, M, G, T (powers of 1000, also KB, MB…).
// Every setting is per phase: an omitted one is 0, not the previous phase's.
package stress

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Limits that catch typos (a missing unit, an extra zero) rather than bound
// any real experiment.
const (
	MaxMemory   = 1 << 40 // bytes
	MaxCPU      = 64      // cores
	MaxDuration = 24 * time.Hour
)

// Phase is one stage of a profile.
type Phase struct {
	Duration time.Duration
	Memory   int64   // bytes held by the end of the ramp
	Ramp     int64   // bytes per second while growing towards Memory; 0: at once
	CPU      float64 // cores burnt (fraction of one core when < 1)
}

// Profile is an ordered list of phases.
type Profile struct {
	Phases []Phase
}

// Duration is the sum of the phases' durations.
func (p Profile) Duration() time.Duration {
	var d time.Duration
	for _, ph := range p.Phases {
		d += ph.Duration
	}
	return d
}

// Validate checks what ParseProfile checks, for profiles built in code.
func (p Profile) Validate() error {
	if len(p.Phases) == 0 {
		return errors.New("the profile has no phase")
	}
	for i, ph := range p.Phases {
		var msg string
		switch {
		case ph.Duration <= 0 || ph.Duration > MaxDuration:
			msg = fmt.Sprintf("duration %v is not in (0, %v]", ph.Duration, MaxDuration)
		case ph.Memory < 0 || ph.Memory > MaxMemory:
			msg = fmt.Sprintf("memory %d is not in [0, %d] bytes", ph.Memory, int64(MaxMemory))
		case ph.Ramp < 0 || ph.Ramp > MaxMemory:
			msg = fmt.Sprintf("ramp %d is not in [0, %d] bytes/s", ph.Ramp, int64(MaxMemory))
		case !(ph.CPU >= 0 && ph.CPU <= MaxCPU): // also catches NaN
			msg = fmt.Sprintf("cpu %v is not in [0, %d] cores", ph.CPU, MaxCPU)
		}
		if msg != "" {
			return fmt.Errorf("phase %d: %s", i+1, msg)
		}
	}
	return nil
}

// Scale multiplies every phase's duration by f (0.1 runs the profile ten times
// faster) and changes nothing else: targets and ramp rates stay as they are, so
// a shortened ramp phase may end before reaching its target.
func (p Profile) Scale(f float64) (Profile, error) {
	if !(f > 0) || math.IsInf(f, 0) {
		return Profile{}, fmt.Errorf("scale %v: want a positive finite factor, e.g. 0.1", f)
	}
	out := Profile{Phases: make([]Phase, len(p.Phases))}
	for i, ph := range p.Phases {
		d := float64(ph.Duration) * f
		if d < float64(time.Millisecond) || d > float64(MaxDuration) {
			return Profile{}, fmt.Errorf("scale %v makes phase %d last %v; keep every phase between 1ms and %v",
				f, i+1, time.Duration(d), MaxDuration)
		}
		ph.Duration = time.Duration(d)
		out.Phases[i] = ph
	}
	return out, nil
}

// String is the profile in the syntax ParseProfile reads; parsing it gives the
// same profile back.
func (p Profile) String() string {
	parts := make([]string, len(p.Phases))
	for i, ph := range p.Phases {
		parts[i] = ph.String()
	}
	return strings.Join(parts, ";")
}

// String is the phase in profile syntax, settings that are 0 left out.
func (ph Phase) String() string {
	var set []string
	if ph.Memory != 0 {
		set = append(set, "mem="+FormatSize(ph.Memory))
	}
	if ph.Ramp != 0 {
		set = append(set, "ramp="+FormatSize(ph.Ramp)+"/s")
	}
	if ph.CPU != 0 {
		set = append(set, "cpu="+strconv.FormatFloat(ph.CPU, 'f', -1, 64))
	}
	if len(set) == 0 {
		return ph.Duration.String()
	}
	return ph.Duration.String() + ":" + strings.Join(set, ",")
}

// FormatSize writes n bytes with the largest binary unit that divides it
// exactly ("60Mi", "1536Ki", "1000").
func FormatSize(n int64) string {
	for _, u := range [...]struct {
		name string
		size int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// SyntaxError says what is wrong in a profile spec, where, and what to write
// instead.
type SyntaxError struct {
	Spec   string
	Offset int    // byte offset in Spec of the faulty text
	Phase  int    // 1-based phase number
	Text   string // the faulty text
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("profile phase %d, column %d (%q): %s", e.Phase, e.Offset+1, e.Text, e.Msg)
}

var units = map[string]int64{
	"": 1, "B": 1,
	"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
	"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
	"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
	"kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
}

// ParseProfile reads a profile (syntax in the package comment). Errors are
// *SyntaxError.
func ParseProfile(spec string) (Profile, error) {
	var p Profile
	pos := 0
	for i, raw := range strings.Split(spec, ";") {
		ph, err := parsePhase(spec, raw, pos, i+1)
		if err != nil {
			return Profile{}, err
		}
		p.Phases = append(p.Phases, ph)
		pos += len(raw) + 1
	}
	return p, nil
}

// token is a piece of the spec with its offset.
type token struct {
	text string
	off  int
}

// trimmed is t without surrounding spaces, its offset moved accordingly.
func (t token) trimmed() token {
	lead := len(t.text) - len(strings.TrimLeftFunc(t.text, unicode.IsSpace))
	return token{strings.TrimSpace(t.text), t.off + lead}
}

func parsePhase(spec, raw string, off, n int) (Phase, error) {
	fail := func(t token, format string, a ...any) (Phase, error) {
		return Phase{}, &SyntaxError{Spec: spec, Offset: t.off, Phase: n, Text: t.text, Msg: fmt.Sprintf(format, a...)}
	}
	whole := token{raw, off}.trimmed()
	if whole.text == "" {
		if strings.TrimSpace(spec) == "" {
			return fail(whole, `empty profile: write phases like "60s;120s:mem=60Mi,cpu=0.4"`)
		}
		return fail(whole, "empty phase: remove the extra ';' or write a phase like 60s:mem=60Mi")
	}
	durText, settings, hasSettings := strings.Cut(whole.text, ":")
	dur := token{durText, whole.off}.trimmed()
	if dur.text == "" {
		return fail(dur, "missing duration: a phase starts with its duration, e.g. 60s:mem=60Mi")
	}
	d, err := time.ParseDuration(dur.text)
	switch {
	case err != nil:
		return fail(dur, "bad duration: write a Go duration such as 90s, 2m or 1m30s")
	case d <= 0:
		return fail(dur, "the duration must be positive")
	case d > MaxDuration:
		return fail(dur, "the duration is over %v; is a unit wrong?", MaxDuration)
	}
	ph := Phase{Duration: d}
	if !hasSettings {
		return ph, nil
	}
	seen := map[string]bool{}
	at := whole.off + len(durText) + 1
	for _, s := range strings.Split(settings, ",") {
		set := token{s, at}.trimmed()
		at += len(s) + 1
		if set.text == "" {
			return fail(set, "empty setting: remove the extra ',' (or ':'), or write key=value with key mem, ramp or cpu")
		}
		key, value, ok := strings.Cut(set.text, "=")
		key = strings.TrimSpace(key)
		val := token{value, set.off + strings.Index(set.text, "=") + 1}.trimmed()
		if !ok {
			return fail(set, "missing '=': write key=value, e.g. mem=60Mi, ramp=10Mi/s or cpu=0.4")
		}
		if seen[key] {
			return fail(set, "%s is set twice in this phase; keep one", key)
		}
		seen[key] = true
		switch key {
		case "mem":
			n, msg := parseSize(val.text)
			if msg != "" {
				return fail(val, "mem: %s", msg)
			}
			ph.Memory = n
		case "ramp":
			num, ok := strings.CutSuffix(val.text, "/s")
			if !ok {
				return fail(val, "ramp is a rate: end it with /s, e.g. ramp=10Mi/s")
			}
			n, msg := parseSize(num)
			if msg != "" {
				return fail(val, "ramp: %s", msg)
			}
			ph.Ramp = n
		case "cpu":
			c, msg := parseCPU(val.text)
			if msg != "" {
				return fail(val, "cpu: %s", msg)
			}
			ph.CPU = c
		default:
			return fail(set, "unknown key %q: the keys are mem (e.g. mem=60Mi), ramp (e.g. ramp=10Mi/s) and cpu (e.g. cpu=0.4)", key)
		}
	}
	return ph, nil
}

// number parses a plain non-negative decimal: digits with at most one '.'. No
// sign, exponent, NaN or Inf, so what is written is what is meant.
func number(s string) (float64, bool) {
	digits, dots := 0, 0
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return 0, false
		}
	}
	if digits == 0 || dots > 1 {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	return f, err == nil
}

// parseSize returns the bytes in s, or a message saying what is wrong.
func parseSize(s string) (int64, string) {
	end := strings.IndexFunc(s, func(c rune) bool { return (c < '0' || c > '9') && c != '.' })
	if end < 0 {
		end = len(s)
	}
	num, unit := s[:end], s[end:]
	f, ok := number(num)
	if !ok {
		return 0, "want a non-negative size such as 60Mi, 1.5Gi or 1048576"
	}
	mult, ok := units[unit]
	switch {
	case unit == "m" || unit == "mi":
		return 0, fmt.Sprintf("unit %q is ambiguous (m is milli in Kubernetes): write Mi for 2^20 or M for 10^6 bytes", unit)
	case !ok:
		return 0, fmt.Sprintf("unknown unit %q: use Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000)", unit)
	}
	b := math.Round(f * float64(mult))
	if b > MaxMemory {
		return 0, fmt.Sprintf("%s is over %s; is a unit wrong?", s, FormatSize(MaxMemory))
	}
	return int64(b), ""
}

// parseCPU reads cores: a decimal (0.4) or Kubernetes millicores (400m).
func parseCPU(s string) (float64, string) {
	if strings.HasSuffix(s, "%") {
		return 0, "write cores, not a percentage: 0.4 (or 400m) is 40 % of one core"
	}
	num, milli := strings.CutSuffix(s, "m")
	f, ok := number(num)
	if !ok {
		return 0, "want a non-negative number of cores such as 0.4 or 400m"
	}
	if milli {
		f /= 1000
	}
	if f > MaxCPU {
		return 0, fmt.Sprintf("%s cores is over %d; is a unit wrong?", s, MaxCPU)
	}
	return f, ""
}
