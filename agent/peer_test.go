package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"

	"github.com/amf-edge/amf/contract"
)

func TestAPeerIsTheAgentsAccountOnANode(t *testing.T) {
	const account = "system:serviceaccount:amf-system:amf-agent"
	ok := func(mut func(*authnv1.TokenReviewStatus)) authnv1.TokenReviewStatus {
		st := authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{contract.StatePeerAudience},
			User: authnv1.UserInfo{Username: account, Extra: map[string]authnv1.ExtraValue{nodeNameExtra: {"node-1"}, podNameExtra: {"amf-agent-x"}}}}
		if mut != nil {
			mut(&st)
		}
		return st
	}
	for _, tt := range []struct {
		name string
		st   authnv1.TokenReviewStatus
		want error
	}{
		{"the agents' token", ok(nil), nil},
		{"not authenticated", ok(func(s *authnv1.TokenReviewStatus) { s.Authenticated = false }), ErrUnauthenticated},
		{"for the sidecars' audience", ok(func(s *authnv1.TokenReviewStatus) { s.Audiences = []string{contract.Audience} }), ErrUnauthenticated},
		{"a broker's ServiceAccount", ok(func(s *authnv1.TokenReviewStatus) { s.User.Username = "system:serviceaccount:tod:broker" }), ErrUnauthenticated},
		{"no node", ok(func(s *authnv1.TokenReviewStatus) { delete(s.User.Extra, nodeNameExtra) }), ErrNotPodBound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			node, err := peerFromReview(tt.st, account)
			if !errors.Is(err, tt.want) || (tt.want == nil && node != "node-1") {
				t.Fatalf("peerFromReview = %q, %v; want node-1 or %v", node, err, tt.want)
			}
		})
	}
}

func TestAccountOfReadsTheSubjectOfTheAgentsOwnToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// {"sub":"system:serviceaccount:amf-system:amf-agent"}
	good := write("good", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6YW1mLXN5c3RlbTphbWYtYWdlbnQifQ.c2ln\n")
	if got, err := AccountOf(good); err != nil || got != "system:serviceaccount:amf-system:amf-agent" {
		t.Fatalf("AccountOf = %q, %v", got, err)
	}
	// {"sub":"alice"}
	for _, p := range []string{write("user", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"), write("opaque", "abcdefabcdefabcdef"), filepath.Join(dir, "missing")} {
		if got, err := AccountOf(p); err == nil {
			t.Errorf("AccountOf(%s) = %q, want an error", filepath.Base(p), got)
		}
	}
	if _, err := NewPeerAuthenticator(nil, "alice"); err == nil {
		t.Error("NewPeerAuthenticator took an account that is no ServiceAccount's")
	}
}
