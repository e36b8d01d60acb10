package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"

	"github.com/amf-edge/amf/contract"
)

// PeerAuthenticator proves that a token is another node's agent's: a
// projected token of the agent's own ServiceAccount for
// contract.StatePeerAudience, bound to a pod on a node, as the TokenReview
// API says. Its answer is that node. The state hubs' relay uses it
// (statehub.PeerAuthenticator): only an agent may put a broker state into
// another node's hub. Each relay is reviewed (a few a minute per pair), so
// there is no cache.
type PeerAuthenticator struct {
	reviews TokenReviewer
	account string // system:serviceaccount:<namespace>:<name>
}

// NewPeerAuthenticator returns a PeerAuthenticator that accepts the tokens
// of account ("system:serviceaccount:<namespace>:<name>", AccountOf the
// agent's own peer token).
func NewPeerAuthenticator(reviews TokenReviewer, account string) (*PeerAuthenticator, error) {
	if rest, ok := strings.CutPrefix(account, serviceAccountPrefix); !ok || strings.Count(rest, ":") != 1 {
		return nil, fmt.Errorf("agent: peer account %q is not a ServiceAccount's username (system:serviceaccount:<namespace>:<name>)", account)
	}
	return &PeerAuthenticator{reviews: reviews, account: account}, nil
}

// AuthenticatePeer reviews token and returns the node of the agent pod it
// is bound to.
func (p *PeerAuthenticator) AuthenticatePeer(ctx context.Context, token string) (string, error) {
	if token == "" || len(token) > maxTokenBytes {
		return "", fmt.Errorf("%w: a token of %d bytes", ErrUnauthenticated, len(token))
	}
	res, err := p.reviews.ReviewToken(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{contract.StatePeerAudience}}})
	if err != nil {
		return "", fmt.Errorf("%w: TokenReview: %w", ErrAuthUnavailable, err)
	}
	return peerFromReview(res.Status, p.account)
}

// peerFromReview maps a TokenReview status to the node of the agent it
// proves.
func peerFromReview(st authnv1.TokenReviewStatus, account string) (string, error) {
	switch {
	case !st.Authenticated:
		return "", fmt.Errorf("%w: not authenticated: %s", ErrUnauthenticated, truncate(st.Error))
	case !slices.Contains(st.Audiences, contract.StatePeerAudience):
		return "", fmt.Errorf("%w: token is not for audience %q", ErrUnauthenticated, contract.StatePeerAudience)
	case st.User.Username != account:
		return "", fmt.Errorf("%w: %q is not the agents' ServiceAccount %q", ErrUnauthenticated, truncate(st.User.Username), account)
	}
	nodes := st.User.Extra[nodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", fmt.Errorf("%w: the agent's token names no node (a projected token, Kubernetes 1.30 or later)", ErrNotPodBound)
	}
	return nodes[0], nil
}

// AccountOf returns the ServiceAccount username a projected token file's
// token was issued to (its "sub" claim, read without verifying it: it is
// the agent's own token, and a peer's is verified by TokenReview against
// it). The agents of a DaemonSet share one ServiceAccount, so this is the
// account every peer's token must show.
func AccountOf(tokenFile string) (string, error) {
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return "", fmt.Errorf("agent: peer token: %w", err)
	}
	parts := strings.Split(strings.TrimSpace(string(b)), ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("agent: peer token %s is not a JWT (a projected ServiceAccount token is)", tokenFile)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("agent: peer token %s: claims: %w", tokenFile, err)
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", fmt.Errorf("agent: peer token %s: claims: %w", tokenFile, err)
	}
	if !strings.HasPrefix(claims.Sub, serviceAccountPrefix) {
		return "", errors.New("agent: peer token " + tokenFile + " is not a ServiceAccount's (its sub claim)")
	}
	return claims.Sub, nil
}
