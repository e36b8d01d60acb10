package agent

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"

	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// Where a TokenReview reports the pod a token is bound to, and its node.
const (
	podNameExtra  = "authentication.kubernetes.io/pod-name"
	nodeNameExtra = "authentication.kubernetes.io/node-name"
)

// serviceAccountPrefix starts the username of every ServiceAccount.
const serviceAccountPrefix = "system:serviceaccount:"

// maxTokenBytes bounds a token before it is sent anywhere; a projected token is
// about 1 KiB.
const maxTokenBytes = 8 << 10

// TokenReviewer creates TokenReviews: the agent's part of the agent's one
// seam to the API server (package cluster). cluster.NewKube is the real
// one, clusterfake.Cluster (its Review) the tests'.
type TokenReviewer interface {
	// ReviewToken creates tr and returns the API server's answer.
	ReviewToken(ctx context.Context, tr *authnv1.TokenReview) (*authnv1.TokenReview, error)
}

var _ TokenReviewer = (*cluster.Kube)(nil)

// TokenReviewOptions tunes a TokenReviewAuthenticator; zero values take defaults.
type TokenReviewOptions struct {
	// Audience the tokens must carry; default contract.Audience.
	Audience string
	// NodeName, when set, refuses tokens of pods on other nodes, so a sidecar
	// reaching another node's agent (the broker listens on a host port) is not
	// taken for one of this node's pods. It needs the node name in bound
	// tokens (Kubernetes 1.30 and later); tokens without it are refused.
	NodeName string
	// CacheTTL is how long a successful review is reused, never past the token's
	// expiry; default 30 s, negative disables the cache. Short, because a bound
	// token dies with its pod and the cache would outlive that by up to the TTL.
	CacheTTL time.Duration
	// CacheSize bounds the number of cached tokens; default 1024 (a node runs
	// about 110 pods).
	CacheSize int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// TokenReviewAuthenticator verifies projected ServiceAccount tokens with the
// Kubernetes TokenReview API (authentication.k8s.io/v1). The identity is the
// token's namespace (from status.user.username,
// "system:serviceaccount:<namespace>:<serviceaccount>") and the pod it is bound
// to (status.user.extra["authentication.kubernetes.io/pod-name"]). Tokens that
// are not authenticated, not for the audience, not a ServiceAccount's, or not
// bound to a pod are refused.
//
// Successful reviews are cached for a short time keyed by the SHA-256 of the
// token, so the token itself is never kept.
type TokenReviewAuthenticator struct {
	reviews  TokenReviewer
	audience string
	node     string
	ttl      time.Duration
	size     int
	now      func() time.Time

	mu    sync.Mutex
	cache map[[sha256.Size]byte]cachedIdentity
}

type cachedIdentity struct {
	id      podsignal.PodID
	expires time.Time
}

// NewTokenReviewAuthenticator returns an authenticator that creates
// TokenReviews with reviews, e.g. cluster.NewKube(clientset).
// The agent's ServiceAccount needs "create" on tokenreviews
// (system:auth-delegator grants it).
func NewTokenReviewAuthenticator(reviews TokenReviewer, opts TokenReviewOptions) *TokenReviewAuthenticator {
	a := &TokenReviewAuthenticator{
		reviews:  reviews,
		audience: opts.Audience,
		node:     opts.NodeName,
		ttl:      opts.CacheTTL,
		size:     opts.CacheSize,
		now:      opts.Now,
		cache:    make(map[[sha256.Size]byte]cachedIdentity),
	}
	if a.audience == "" {
		a.audience = contract.Audience
	}
	if a.ttl == 0 {
		a.ttl = 30 * time.Second
	}
	if a.size <= 0 {
		a.size = 1024
	}
	if a.now == nil {
		a.now = time.Now
	}
	return a
}

// Authenticate reviews token, or reuses a recent review of the same token.
func (a *TokenReviewAuthenticator) Authenticate(ctx context.Context, token string) (podsignal.PodID, error) {
	if token == "" {
		return podsignal.PodID{}, fmt.Errorf("%w: empty token", ErrUnauthenticated)
	}
	if len(token) > maxTokenBytes {
		return podsignal.PodID{}, fmt.Errorf("%w: token of %d bytes, at most %d", ErrUnauthenticated, len(token), maxTokenBytes)
	}
	key := sha256.Sum256([]byte(token))
	if id, ok := a.lookup(key); ok {
		return id, nil
	}
	review := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token, Audiences: []string{a.audience}}}
	res, err := a.reviews.ReviewToken(ctx, review)
	if err != nil {
		return podsignal.PodID{}, fmt.Errorf("%w: TokenReview: %w", ErrAuthUnavailable, err)
	}
	id, err := identityFromReview(res.Status, a.audience, a.node)
	if err != nil {
		return podsignal.PodID{}, err
	}
	if exp, ok := tokenExpiry(token); ok {
		a.store(key, id, exp)
	}
	return id, nil
}

func (a *TokenReviewAuthenticator) lookup(key [sha256.Size]byte) (podsignal.PodID, bool) {
	if a.ttl < 0 {
		return podsignal.PodID{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.cache[key]
	if !ok {
		return podsignal.PodID{}, false
	}
	if !a.now().Before(c.expires) {
		delete(a.cache, key)
		return podsignal.PodID{}, false
	}
	return c.id, true
}

// store caches a review until the earlier of the TTL and the token's expiry.
func (a *TokenReviewAuthenticator) store(key [sha256.Size]byte, id podsignal.PodID, tokenExp time.Time) {
	if a.ttl < 0 {
		return
	}
	now := a.now()
	expires := now.Add(a.ttl)
	if tokenExp.Before(expires) {
		expires = tokenExp
	}
	if !now.Before(expires) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= a.size {
		for k, c := range a.cache {
			if !now.Before(c.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= a.size {
			// Still full of live entries: start over rather than track recency;
			// the cost is one review per client, once.
			clear(a.cache)
		}
	}
	a.cache[key] = cachedIdentity{id: id, expires: expires}
}

// identityFromReview maps a TokenReview status to an identity; node, when not
// empty, is the only node the pod may run on.
func identityFromReview(st authnv1.TokenReviewStatus, audience, node string) (podsignal.PodID, error) {
	if !st.Authenticated {
		msg := "not authenticated"
		if st.Error != "" {
			msg += ": " + truncate(st.Error)
		}
		return podsignal.PodID{}, fmt.Errorf("%w: %s", ErrUnauthenticated, msg)
	}
	// An empty status.audiences means the token is valid for the API server's
	// own audience, not necessarily ours (TokenReviewStatus documentation).
	if !slices.Contains(st.Audiences, audience) {
		return podsignal.PodID{}, fmt.Errorf("%w: token is not for audience %q", ErrUnauthenticated, audience)
	}
	rest, ok := strings.CutPrefix(st.User.Username, serviceAccountPrefix)
	if !ok {
		return podsignal.PodID{}, fmt.Errorf("%w: %q is not a ServiceAccount", ErrUnauthenticated, truncate(st.User.Username))
	}
	ns, sa, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || sa == "" {
		return podsignal.PodID{}, fmt.Errorf("%w: malformed ServiceAccount username %q", ErrUnauthenticated, truncate(st.User.Username))
	}
	pods := st.User.Extra[podNameExtra]
	if len(pods) != 1 || pods[0] == "" {
		return podsignal.PodID{}, fmt.Errorf("%w: ServiceAccount %s/%s token has no bound pod (use a projected token)", ErrNotPodBound, ns, sa)
	}
	if err := podsignal.ValidateNames(ns, pods[0]); err != nil {
		return podsignal.PodID{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	if node != "" {
		if nodes := st.User.Extra[nodeNameExtra]; len(nodes) != 1 || nodes[0] != node {
			return podsignal.PodID{}, fmt.Errorf("%w: pod %s/%s is on node %q, this agent serves node %q", ErrUnauthenticated, ns, pods[0], strings.Join(nodes, ","), node)
		}
	}
	return podsignal.PodID{Namespace: ns, Pod: pods[0]}, nil
}

// tokenExpiry reads the "exp" claim of a JWT without verifying it. It is used
// only after the API server accepted the very same token, to keep the cache
// from outliving it.
func tokenExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	return time.Unix(*claims.Exp, 0), true
}
