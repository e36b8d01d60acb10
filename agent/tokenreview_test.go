package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"

	"github.com/amf-edge/amf/cluster/clusterfake"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// fakeReviews answers TokenReviews from the fake cluster with
// status(token), checking that each request asks for the agent's audience.
func fakeReviews(t *testing.T, status func(token string) (authnv1.TokenReviewStatus, error)) (*clusterfake.Cluster, *atomic.Int32) {
	t.Helper()
	c := clusterfake.New()
	var calls atomic.Int32
	c.Review = func(tr *authnv1.TokenReview) (authnv1.TokenReviewStatus, error) {
		calls.Add(1)
		if !slices.Equal(tr.Spec.Audiences, []string{contract.Audience}) {
			t.Errorf("review asks for audiences %q, want [%q]", tr.Spec.Audiences, contract.Audience)
		}
		return status(tr.Spec.Token)
	}
	return c, &calls
}

// podBound is the status the API server gives a projected token of pod ns/pod.
func podBound(ns, sa, pod string) authnv1.TokenReviewStatus {
	return authnv1.TokenReviewStatus{
		Authenticated: true,
		Audiences:     []string{contract.Audience},
		User: authnv1.UserInfo{
			Username: "system:serviceaccount:" + ns + ":" + sa,
			UID:      "3c9d1f0e-0000-4000-8000-000000000001",
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			Extra: map[string]authnv1.ExtraValue{
				podNameExtra:                           {pod},
				"authentication.kubernetes.io/pod-uid": {"6f1c2a0e-0000-4000-8000-000000000002"},
				nodeNameExtra:                          {"edge-1"},
			},
		},
	}
}

// jwt returns a token shaped like a JWT with the given expiry (unsigned: the
// fake API server does not check).
func jwt(exp time.Time, salt string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(fmt.Sprintf(`{"exp":%d,"jti":%q}`, exp.Unix(), salt))) + ".c2ln"
}

func TestTokenReviewMapsTheReviewToAnIdentity(t *testing.T) {
	tests := []struct {
		name   string
		node   string // TokenReviewOptions.NodeName
		status func() authnv1.TokenReviewStatus
		want   podsignal.PodID
		err    error
	}{
		{"pod-bound token", "", func() authnv1.TokenReviewStatus { return podBound("tod", "broker", "broker-7f57c8d79b-f2m5m") },
			podsignal.PodID{Namespace: "tod", Pod: "broker-7f57c8d79b-f2m5m"}, nil},
		{"not authenticated", "", func() authnv1.TokenReviewStatus {
			return authnv1.TokenReviewStatus{Authenticated: false, Error: "token has expired"}
		}, podsignal.PodID{}, ErrUnauthenticated},
		{"wrong audience", "", func() authnv1.TokenReviewStatus {
			st := podBound("tod", "broker", "b-1")
			st.Audiences = []string{"https://kubernetes.default.svc"}
			return st
		}, podsignal.PodID{}, ErrUnauthenticated},
		{"no audience: the API server's own", "", func() authnv1.TokenReviewStatus {
			st := podBound("tod", "broker", "b-1")
			st.Audiences = nil
			return st
		}, podsignal.PodID{}, ErrUnauthenticated},
		{"not bound to a pod", "", func() authnv1.TokenReviewStatus {
			st := podBound("tod", "broker", "b-1")
			delete(st.User.Extra, podNameExtra)
			return st
		}, podsignal.PodID{}, ErrNotPodBound},
		{"two pod names", "", func() authnv1.TokenReviewStatus {
			st := podBound("tod", "broker", "b-1")
			st.User.Extra[podNameExtra] = authnv1.ExtraValue{"b-1", "b-2"}
			return st
		}, podsignal.PodID{}, ErrNotPodBound},
		{"a user, not a ServiceAccount", "", func() authnv1.TokenReviewStatus {
			st := podBound("tod", "broker", "b-1")
			st.User.Username = "alice"
			return st
		}, podsignal.PodID{}, ErrUnauthenticated},
		{"malformed ServiceAccount name", "", func() authnv1.TokenReviewStatus {
			st := podBound("tod", "broker", "b-1")
			st.User.Username = "system:serviceaccount:tod"
			return st
		}, podsignal.PodID{}, ErrUnauthenticated},
		{"pod name that cannot be a topic", "", func() authnv1.TokenReviewStatus { return podBound("tod", "broker", "b/+") },
			podsignal.PodID{}, ErrUnauthenticated},
		{"pod on this agent's node", "edge-1", func() authnv1.TokenReviewStatus { return podBound("tod", "broker", "b-1") },
			podsignal.PodID{Namespace: "tod", Pod: "b-1"}, nil},
		{"pod on another node", "edge-2", func() authnv1.TokenReviewStatus { return podBound("tod", "broker", "b-1") },
			podsignal.PodID{}, ErrUnauthenticated},
		{"token without a node", "edge-1", func() authnv1.TokenReviewStatus {
			st := podBound("tod", "broker", "b-1")
			delete(st.User.Extra, nodeNameExtra)
			return st
		}, podsignal.PodID{}, ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs, _ := fakeReviews(t, func(string) (authnv1.TokenReviewStatus, error) { return tt.status(), nil })
			a := NewTokenReviewAuthenticator(cs, TokenReviewOptions{NodeName: tt.node})
			const token = "the-token-itself"
			id, err := a.Authenticate(context.Background(), token)
			if tt.err == nil {
				if err != nil || id != tt.want {
					t.Fatalf("Authenticate = %v, %v; want %v", id, err, tt.want)
				}
				return
			}
			if !errors.Is(err, tt.err) {
				t.Fatalf("error = %v, want %v", err, tt.err)
			}
			if strings.Contains(err.Error(), token) {
				t.Errorf("error echoes the token: %v", err)
			}
		})
	}
}

func TestTokenReviewAPIFailureIsUnavailable(t *testing.T) {
	cs, _ := fakeReviews(t, func(string) (authnv1.TokenReviewStatus, error) {
		return authnv1.TokenReviewStatus{}, errors.New("connection refused")
	})
	a := NewTokenReviewAuthenticator(cs, TokenReviewOptions{})
	_, err := a.Authenticate(context.Background(), "tok")
	if !errors.Is(err, ErrAuthUnavailable) || refuseReason(err) != refuseAuthError {
		t.Fatalf("error = %v, want ErrAuthUnavailable", err)
	}
	for _, tok := range []string{"", strings.Repeat("x", maxTokenBytes+1)} {
		if _, err := a.Authenticate(context.Background(), tok); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("token of %d bytes: error = %v, want ErrUnauthenticated without a review", len(tok), err)
		}
	}
}

func TestTokenReviewCacheIsShortAndBoundedByExpiry(t *testing.T) {
	now := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	var refuse atomic.Bool
	cs, calls := fakeReviews(t, func(string) (authnv1.TokenReviewStatus, error) {
		if refuse.Load() {
			return authnv1.TokenReviewStatus{Authenticated: false}, nil
		}
		return podBound("tod", "broker", "b-1"), nil
	})
	a := NewTokenReviewAuthenticator(cs, TokenReviewOptions{CacheTTL: 30 * time.Second, Now: clock})
	ctx := context.Background()
	auth := func(tok string) {
		t.Helper()
		if _, err := a.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}

	long := jwt(now.Add(time.Hour), "long")
	auth(long)
	auth(long)
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d reviews for a cached token, want 1", n)
	}
	now = now.Add(31 * time.Second) // past the TTL
	auth(long)
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d reviews after the TTL, want 2", n)
	}

	short := jwt(now.Add(10*time.Second), "short") // expires before the TTL
	auth(short)
	now = now.Add(11 * time.Second)
	refuse.Store(true) // the token has expired: the API server now says no
	if _, err := a.Authenticate(ctx, short); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("expired token served from the cache: %v", err)
	}

	// Tokens without an expiry, and refusals, are never cached.
	refuse.Store(false)
	before := calls.Load()
	auth("opaque-token")
	auth("opaque-token")
	if n := calls.Load() - before; n != 2 {
		t.Errorf("%d reviews for an opaque token, want 2", n)
	}

	// A full cache of live entries starts over instead of growing.
	small := NewTokenReviewAuthenticator(cs, TokenReviewOptions{CacheSize: 2, Now: clock})
	for i := range 5 {
		if _, err := small.Authenticate(ctx, jwt(now.Add(time.Hour), fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		if n := len(small.cache); n > 2 {
			t.Fatalf("cache holds %d entries, limit 2", n)
		}
	}
}
