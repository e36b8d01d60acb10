package contract

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Annotation keys of the policy, the role exchange and the switchover record.
const (
	AnnStandby      = "amf.io/standby"
	AnnRedundancy   = "amf.io/redundancy"
	AnnThreshold    = "amf.io/threshold"
	AnnDebounce     = "amf.io/debounce"
	AnnReconfirm    = "amf.io/reconfirm"
	AnnHold         = "amf.io/hold"
	AnnReadyTimeout = "amf.io/ready-timeout"
	AnnCooldown     = "amf.io/cooldown"
	AnnAbortDelay   = "amf.io/abort-delay"
	// AnnSidecarGrace is how long a primary whose sidecar went away
	// without a word is given for it to speak again before the failover.
	AnnSidecarGrace = "amf.io/sidecar-grace"
	// AnnMemoryCeiling is the most memory the agent may give the broker
	// container by resizing it in place before it switches over; absent, it
	// never resizes.
	AnnMemoryCeiling = "amf.io/memory-ceiling"
	// AnnResizeTimeout bounds the wait for an in-place resize to take
	// effect before the agent switches over instead.
	AnnResizeTimeout = "amf.io/resize-timeout"
	// AnnMemorySize is the memory limit, in bytes, the broker container
	// needed: written by the agent on both Deployments of a pair when a
	// resize in place took effect. The agent gives it to each pod of the
	// pair that starts smaller (in place) and to the pod template of a
	// Deployment while it runs no pod (so nothing rolls). Remove it to
	// stop that; the agent never lowers a limit.
	AnnMemorySize = "amf.io/memory-size"
	// AnnRole is "primary" or "standby"; written by the role exchange.
	AnnRole = "amf.io/role"
	// AnnPrimary names the primary on a standby after a role exchange.
	AnnPrimary = "amf.io/primary"
	// AnnRecord holds the Gate's Record as JSON on the primary.
	AnnRecord = "amf.io/switchover"
	// AnnPrimaryNode, on a hot standby, names the node its primary's pod
	// runs on; written by that node's agent, so the standby's agent knows
	// which node to guard (DESIGN.md, "Losing a whole node").
	AnnPrimaryNode = "amf.io/primary-node"
	// AnnStandbyNode, on a hot standby, names the node its own pod runs on;
	// written by that node's agent (the guard), so the primary's agent
	// knows whom to probe before it fences.
	AnnStandbyNode = "amf.io/standby-node"
	// AnnStandbyReady, on the standby of a stateful pair, names its pod
	// that is ready in all but its readiness gate, which the agent holds
	// False until the pod holds the primary's state (DESIGN.md, "Broker
	// state"); written by the agent of the pod's node. Such a standby is
	// never Ready, so this is what the primary's agent waits for instead.
	AnnStandbyReady = "amf.io/standby-ready"
	// AnnStandbyHub, on the standby of a stateful pair, is the state hub
	// of its pod's node ("http://<node address>:<port>"), written by that
	// node's agent: where the primary's agent relays its pod's snapshots
	// and final state when the pair spans two nodes.
	AnnStandbyHub = "amf.io/standby-hub"
	// AnnHandover, on the new primary of a stateful pair, says which
	// state its pod is to run on before it serves (a JSON
	// Handover), written by the role exchange; the agent of that pod's
	// node carries it out and removes it.
	AnnHandover = "amf.io/state-handover"
)

// PolicyKeys returns the annotations of the policy: what a role exchange
// moves from the old to the new primary.
func PolicyKeys() []string {
	return []string{AnnStandby, AnnRedundancy, AnnThreshold, AnnDebounce, AnnReconfirm, AnnHold, AnnReadyTimeout, AnnCooldown, AnnAbortDelay, AnnSidecarGrace, AnnMemoryCeiling, AnnResizeTimeout}
}

// ConditionHealthy is the readiness-gate condition the agent maintains on
// pods that declare it (untyped, so it is a corev1.PodConditionType where one
// is wanted).
const ConditionHealthy = "amf.io/healthy"

// Audience is the audience a sidecar's projected ServiceAccount token must be
// issued for. A token for another audience (the API server's own, say) is
// refused, so a token stolen from this broker is useless elsewhere and the
// reverse.
const Audience = "amf-agent"

// StatePeerAudience is the audience of the token one node's agent shows
// another's state hub when it relays a broker state: of its own, so that
// neither a sidecar's token nor the agent's API token opens the relay, and
// a captured relay token opens nothing else.
const StatePeerAudience = "amf-agent-peer"

// Redundancy is how the standby is kept.
type Redundancy string

// The redundancy models.
const (
	// Cold: the standby has 0 replicas until needed; the agent scales it 0→1
	// and back.
	Cold Redundancy = "cold"
	// Hot: the standby already runs; the agent never scales it.
	Hot Redundancy = "hot"
	// None: no standby actions; only the readiness gate is maintained.
	None Redundancy = "none"
)

// Gates are the thresholds of the switchover; DefaultGates are the paper's.
type Gates struct {
	Threshold    float64       // probability at or above which a sample is anomalous
	Debounce     int           // consecutive anomalous samples before the decision
	Reconfirm    int           // anomalous samples after the standby is Ready
	Hold         time.Duration // least time between decision and retiring the primary
	ReadyTimeout time.Duration // standby must become Ready within this after the decision
	Cooldown     time.Duration // flap guard: least time between two switchovers
	AbortDelay   time.Duration // a cold standby started in vain is scaled back after this
	// ResizeTimeout bounds the wait for an in-place resize (decision to the
	// new limit seen by the kubelet and by the sidecar) before switching over.
	ResizeTimeout time.Duration
	// SidecarGrace is how long a primary whose sidecar went away without a
	// word (its Last Will, its session ended) waits for a word from its pod
	// before it is failed over as a crash: a killed sidecar, restarted by
	// the kubelet, speaks again within a second or two, and its broker
	// served meanwhile. A crash of the broker itself is said by the
	// sidecar (unhealthy) or by node mode's pushed exit, and fails over at
	// once. 0: a silent sidecar is a crash at once.
	SidecarGrace time.Duration
}

// DefaultGates returns the defaults of the paper (threshold 0.5, debounce 3,
// hold 15 s) and of this project for what the paper leaves open.
func DefaultGates() Gates {
	return Gates{
		Threshold:    0.5,
		Debounce:     3,
		Reconfirm:    3,
		Hold:         15 * time.Second,
		ReadyTimeout: 2 * time.Minute,
		Cooldown:     5 * time.Minute,
		AbortDelay:   30 * time.Second,
		// A resize the node can hold is applied by the kubelet's next pod
		// sync (about a second) and seen by the sidecar's next sample.
		ResizeTimeout: 20 * time.Second,
		SidecarGrace:  5 * time.Second,
	}
}

// Policy is the recovery policy of one primary Deployment.
type Policy struct {
	Standby    string
	Redundancy Redundancy
	Gates      Gates
	// MemoryCeiling is amf.io/memory-ceiling in bytes: the most memory a
	// resize in place may give the broker container; 0, no resize.
	MemoryCeiling uint64
}

// ErrInvalidPolicy wraps every policy error.
var ErrInvalidPolicy = errors.New("invalid amf.io policy")

// ParsePolicy reads the policy from a Deployment's annotations. managed is
// false when the Deployment carries no amf.io/standby (it is not a primary);
// err is non-nil (wrapping ErrInvalidPolicy, naming every bad key) when the
// policy is present but invalid, in which case the agent must not act.
func ParsePolicy(name string, ann map[string]string) (p Policy, managed bool, err error) {
	standby, ok := ann[AnnStandby]
	if !ok {
		return Policy{}, false, nil
	}
	p = Policy{Standby: standby, Redundancy: Cold, Gates: DefaultGates()}
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s=%q: %s", key, ann[key], fmt.Sprintf(format, args...)))
	}
	if msgs := dns1123Subdomain(standby); len(msgs) > 0 {
		bad(AnnStandby, "not a Deployment name: %s", strings.Join(msgs, "; "))
	} else if standby == name {
		bad(AnnStandby, "a Deployment cannot be its own standby")
	}
	if v, ok := ann[AnnRedundancy]; ok {
		switch r := Redundancy(v); r {
		case Cold, Hot, None:
			p.Redundancy = r
		default:
			bad(AnnRedundancy, "want cold, hot or none")
		}
	}
	if v, ok := ann[AnnThreshold]; ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 1) {
			bad(AnnThreshold, "want a probability in (0, 1]")
		} else {
			p.Gates.Threshold = f
		}
	}
	for _, c := range []struct {
		key string
		dst *int
	}{{AnnDebounce, &p.Gates.Debounce}, {AnnReconfirm, &p.Gates.Reconfirm}} {
		v, ok := ann[c.key]
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			bad(c.key, "want a whole number of samples from 1 to 1000")
			continue
		}
		*c.dst = n
	}
	for _, c := range []struct {
		key      string
		dst      *time.Duration
		zeroOK   bool
		min, max time.Duration
	}{
		{AnnHold, &p.Gates.Hold, true, 0, time.Hour},
		{AnnReadyTimeout, &p.Gates.ReadyTimeout, false, time.Second, time.Hour},
		{AnnCooldown, &p.Gates.Cooldown, true, 0, 24 * time.Hour},
		{AnnAbortDelay, &p.Gates.AbortDelay, true, 0, time.Hour},
		{AnnSidecarGrace, &p.Gates.SidecarGrace, true, 0, 5 * time.Minute},
		{AnnResizeTimeout, &p.Gates.ResizeTimeout, false, time.Second, 10 * time.Minute},
	} {
		v, ok := ann[c.key]
		if !ok {
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < c.min || d > c.max || (d == 0 && !c.zeroOK) {
			bad(c.key, "want a duration from %v to %v", c.min, c.max)
			continue
		}
		*c.dst = d
	}
	if v, ok := ann[AnnMemoryCeiling]; ok {
		n, err := ParseMemoryQuantity(v)
		if err != nil {
			bad(AnnMemoryCeiling, "%v", err)
		} else {
			p.MemoryCeiling = n
		}
	}
	if len(errs) > 0 {
		return Policy{}, true, fmt.Errorf("%w: %w", ErrInvalidPolicy, errors.Join(errs...))
	}
	return p, true, nil
}

// The DNS-1123 subdomain rule of Kubernetes object names, as apimachinery's
// validation.IsDNS1123Subdomain states it (same messages; policy_test checks
// the two agree), restated so this package links no Kubernetes module.
const (
	dns1123LabelFmt          = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
	dns1123SubdomainFmt      = dns1123LabelFmt + "(\\." + dns1123LabelFmt + ")*"
	dns1123SubdomainErrorMsg = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
	dns1123SubdomainMaxLen   = 253
)

var dns1123SubdomainRegexp = regexp.MustCompile("^" + dns1123SubdomainFmt + "$")

// dns1123Subdomain returns what is wrong with value as an object name, nothing
// when it is one.
func dns1123Subdomain(value string) []string {
	var errs []string
	if len(value) > dns1123SubdomainMaxLen {
		errs = append(errs, fmt.Sprintf("must be no more than %d characters", dns1123SubdomainMaxLen))
	}
	if !dns1123SubdomainRegexp.MatchString(value) {
		errs = append(errs, dns1123SubdomainErrorMsg+" (e.g. 'example.com', regex used for validation is '"+dns1123SubdomainFmt+"')")
	}
	return errs
}
