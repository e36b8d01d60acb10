package agent

import (
	"context"
	"errors"
	"strings"

	"github.com/amf-edge/amf/podsignal"
)

// Authenticator turns the token a client presents into the identity it proves.
// Implementations must be safe for concurrent use, must honour ctx, and must
// never put the token into an error or a log.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (podsignal.PodID, error)
}

// Errors an Authenticator returns, to be checked with errors.Is. Each is a
// distinct refusal reason in the agent's metrics.
var (
	// ErrUnauthenticated: the token is unknown, expired, malformed or meant for
	// another audience.
	ErrUnauthenticated = errors.New("agent: token not accepted")
	// ErrNotPodBound: the token is valid but does not name a pod, so it cannot
	// say which topic its holder may publish to.
	ErrNotPodBound = errors.New("agent: token is not bound to a pod")
	// ErrAuthUnavailable: the token could not be checked (API server down,
	// timeout); the client may retry.
	ErrAuthUnavailable = errors.New("agent: authenticator unavailable")
)

// truncate keeps hostile input out of logs at full length.
func truncate(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}
