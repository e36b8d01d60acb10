package statehub

import (
	"context"
	"errors"

	"github.com/amf-edge/amf/podsignal"
)

// FakeTokens is an Authenticator for tests, beside the agent's TokenReview
// (and its static token file): each token proves the pod it maps to.
type FakeTokens map[string]podsignal.PodID

// Authenticate returns the pod token proves.
func (f FakeTokens) Authenticate(_ context.Context, token string) (podsignal.PodID, error) {
	if id, ok := f[token]; ok {
		return id, nil
	}
	return podsignal.PodID{}, errors.New("statehub: token not accepted (fake)")
}

// FakePeers is a PeerAuthenticator for tests, beside the agent's
// TokenReview: each token proves the node it maps to.
type FakePeers map[string]string

// AuthenticatePeer returns the node token proves.
func (f FakePeers) AuthenticatePeer(_ context.Context, token string) (string, error) {
	if n, ok := f[token]; ok {
		return n, nil
	}
	return "", errors.New("statehub: peer token not accepted (fake)")
}
