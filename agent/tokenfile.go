package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"

	"github.com/amf-edge/amf/podsignal"
)

// Limits of the static token file.
const (
	// MinStaticTokenBytes refuses tokens short enough to guess.
	MinStaticTokenBytes = 16
	// maxStaticTokenBytes matches what fits in a CONNECT packet.
	maxStaticTokenBytes = maxTokenBytes
	// maxTokenFileBytes bounds what a reload reads: a node has ~110 pods.
	maxTokenFileBytes = 1 << 20
)

// Errors of the static token file, to be checked with errors.Is.
var (
	// ErrTokenFileMode: the file is accessible to group or others.
	ErrTokenFileMode = errors.New("agent: token file is accessible by group or others")
	// ErrTokenFileSyntax: a line is not "token namespace/pod", or a token repeats.
	ErrTokenFileSyntax = errors.New("agent: token file syntax")
)

// StaticTokens authenticates clients against a file of shared tokens, for use
// outside Kubernetes. Each line is
//
//	<token> <namespace>/<pod>
//
// separated by spaces or tabs; blank lines and lines starting with '#' are
// ignored (so a token cannot start with '#'). A token is 16 to 8192 bytes of
// printable ASCII without spaces and may appear once; one pod may have several
// tokens (rotation). The file must not be accessible by group or others (mode
// 0600 or 0400): it holds credentials.
//
// Tokens are kept only as SHA-256 hashes. Reload re-reads the file; a file that
// fails to load leaves the previous tokens in force.
type StaticTokens struct {
	path  string
	table atomic.Pointer[map[[sha256.Size]byte]podsignal.PodID]
}

// LoadStaticTokens reads the token file at path.
func LoadStaticTokens(path string) (*StaticTokens, error) {
	s := &StaticTokens{path: path}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload re-reads the token file. On error the tokens loaded before stay in force.
func (s *StaticTokens) Reload() error {
	data, err := readTokenFile(s.path)
	if err != nil {
		return err
	}
	entries, err := parseTokens(data)
	if err != nil {
		return fmt.Errorf("%s: %w", s.path, err)
	}
	if len(entries) == 0 {
		return fmt.Errorf("%w: %s holds no tokens", ErrTokenFileSyntax, s.path)
	}
	table := make(map[[sha256.Size]byte]podsignal.PodID, len(entries))
	for _, e := range entries {
		table[sha256.Sum256([]byte(e.token))] = e.identity
	}
	s.table.Store(&table)
	return nil
}

// Len returns the number of tokens in force.
func (s *StaticTokens) Len() int { return len(*s.table.Load()) }

// Authenticate returns the identity of a token of the file.
func (s *StaticTokens) Authenticate(_ context.Context, token string) (podsignal.PodID, error) {
	// Looking up the hash rather than the token keeps the comparison from
	// leaking how much of a guessed token was right.
	id, ok := (*s.table.Load())[sha256.Sum256([]byte(token))]
	if !ok {
		return podsignal.PodID{}, fmt.Errorf("%w: not in the token file", ErrUnauthenticated)
	}
	return id, nil
}

// readTokenFile reads a token file after checking that only its owner can read it.
func readTokenFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("agent: token file: %w", err)
	}
	defer f.Close()
	// Stat the open file, not the path, so the checked file is the read one.
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("agent: token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("agent: token file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o; it holds credentials, run chmod 600 %s", ErrTokenFileMode, path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("agent: token file: %w", err)
	}
	if len(data) > maxTokenFileBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrTokenFileSyntax, path, maxTokenFileBytes)
	}
	return data, nil
}

// tokenEntry is one line of a token file.
type tokenEntry struct {
	token    string
	identity podsignal.PodID
	line     int
}

// parseTokens parses a token file. Errors name lines, never tokens: the file
// and its errors end up in different places (logs, terminals).
func parseTokens(data []byte) ([]tokenEntry, error) {
	var entries []tokenEntry
	seen := make(map[string]int)
	for n, raw := range bytes.Split(data, []byte("\n")) {
		line := n + 1
		text := strings.TrimSpace(string(raw))
		if text == "" || text[0] == '#' {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%w: line %d: want \"<token> <namespace>/<pod>\", found %d fields", ErrTokenFileSyntax, line, len(fields))
		}
		token, name := fields[0], fields[1]
		if len(token) < MinStaticTokenBytes || len(token) > maxStaticTokenBytes {
			return nil, fmt.Errorf("%w: line %d: token of %d bytes, want %d to %d", ErrTokenFileSyntax, line, len(token), MinStaticTokenBytes, maxStaticTokenBytes)
		}
		for i := 0; i < len(token); i++ {
			if c := token[i]; c < 0x21 || c > 0x7e {
				return nil, fmt.Errorf("%w: line %d: token must be printable ASCII", ErrTokenFileSyntax, line)
			}
		}
		ns, pod, ok := strings.Cut(name, "/")
		if !ok {
			return nil, fmt.Errorf("%w: line %d: identity must be <namespace>/<pod>", ErrTokenFileSyntax, line)
		}
		if err := podsignal.ValidateNames(ns, pod); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrTokenFileSyntax, line, err)
		}
		if first, dup := seen[token]; dup {
			return nil, fmt.Errorf("%w: line %d repeats the token of line %d", ErrTokenFileSyntax, line, first)
		}
		seen[token] = line
		entries = append(entries, tokenEntry{token: token, identity: podsignal.PodID{Namespace: ns, Pod: pod}, line: line})
	}
	return entries, nil
}
