package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amf-edge/amf/podsignal"
)

func TestParseTokens(t *testing.T) {
	const tok1, tok2 = "0123456789abcdef", "fedcba9876543210~!"
	entries, err := parseTokens([]byte("# comment\n\n  " + tok1 + "\ttod/broker-a  \r\n" + tok2 + " tod/broker-a.v2\n#" + tok1 + " x/y\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []tokenEntry{
		{token: tok1, identity: podsignal.PodID{Namespace: "tod", Pod: "broker-a"}, line: 3},
		{token: tok2, identity: podsignal.PodID{Namespace: "tod", Pod: "broker-a.v2"}, line: 4},
	}
	if len(entries) != len(want) {
		t.Fatalf("entries = %+v", entries)
	}
	for i := range want {
		if entries[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, entries[i], want[i])
		}
	}
}

func TestParseTokensRefusesAndNeverEchoesTheToken(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	tests := []struct{ name, file string }{
		{"one field", secret},
		{"three fields", secret + " tod/a extra"},
		{"short token", "short tod/a"},
		{"non-ASCII token", secret + "é tod/a"},
		{"no slash", secret + " tod-a"},
		{"bad namespace", secret + " Tod/a"},
		{"bad pod", secret + " tod/a_b"},
		{"two slashes", secret + " tod/a/b"},
		{"duplicate token", secret + " tod/a\n" + secret + " tod/b"},
		{"token too long", strings.Repeat("x", maxStaticTokenBytes+1) + " tod/a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseTokens([]byte(tt.file))
			if !errors.Is(err, ErrTokenFileSyntax) {
				t.Fatalf("error = %v, want ErrTokenFileSyntax", err)
			}
			if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "xxxxxxxx") {
				t.Errorf("error echoes the token: %v", err)
			}
			if !strings.Contains(err.Error(), "line ") {
				t.Errorf("error does not name the line: %v", err)
			}
		})
	}
}

func TestStaticTokensRefuseAFileOthersCanRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte(tokenA+" tod/broker-a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	_, err := LoadStaticTokens(path)
	if !errors.Is(err, ErrTokenFileMode) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("error = %v, want ErrTokenFileMode telling to chmod 600", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o602} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadStaticTokens(path); !errors.Is(err, ErrTokenFileMode) {
			t.Errorf("mode %04o: error = %v, want ErrTokenFileMode", mode, err)
		}
	}
	if err := os.Chmod(path, 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadStaticTokens(path); err != nil {
		t.Errorf("mode 0400: %v", err)
	}
	if _, err := LoadStaticTokens(t.TempDir()); err == nil {
		t.Error("a directory was accepted as a token file")
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("# nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadStaticTokens(empty); !errors.Is(err, ErrTokenFileSyntax) {
		t.Errorf("empty file: error = %v, want ErrTokenFileSyntax", err)
	}
}

func TestStaticTokensAuthenticateAndReload(t *testing.T) {
	s := staticTokens(t, tokenA+" tod/broker-a")
	ctx := context.Background()
	if id, err := s.Authenticate(ctx, tokenA); err != nil || id != podA {
		t.Fatalf("Authenticate(tokenA) = %v, %v", id, err)
	}
	if _, err := s.Authenticate(ctx, tokenB); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("unknown token: error = %v, want ErrUnauthenticated", err)
	}
	if err := os.WriteFile(s.path, []byte(tokenB+" tod/broker-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, tokenA); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("token removed by reload still accepted: %v", err)
	}
	if id, err := s.Authenticate(ctx, tokenB); err != nil || id != podB {
		t.Errorf("Authenticate(tokenB) after reload = %v, %v", id, err)
	}
	// A broken file keeps the tokens in force.
	if err := os.WriteFile(s.path, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); !errors.Is(err, ErrTokenFileSyntax) {
		t.Fatalf("Reload of a broken file: %v", err)
	}
	if id, err := s.Authenticate(ctx, tokenB); err != nil || id != podB {
		t.Errorf("tokens lost by a failed reload: %v, %v", id, err)
	}
}

// FuzzParseTokens: the parser never panics, accepts only well-formed entries,
// and what it accepts survives a round trip. Seed corpus in
// testdata/fuzz/FuzzParseTokens.
func FuzzParseTokens(f *testing.F) {
	f.Add([]byte("0123456789abcdef tod/broker-a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := parseTokens(data)
		if err != nil {
			if !errors.Is(err, ErrTokenFileSyntax) {
				t.Fatalf("error %v is not ErrTokenFileSyntax", err)
			}
			return
		}
		var out strings.Builder
		seen := make(map[string]bool)
		for _, e := range entries {
			if len(e.token) < MinStaticTokenBytes || strings.ContainsAny(e.token, " \t\r\n") || e.token[0] == '#' || seen[e.token] {
				t.Fatalf("accepted token of line %d is malformed or repeated", e.line)
			}
			seen[e.token] = true
			// The identity must make a health topic that names it back.
			if ns, pod, err := podsignal.ParseTopic(e.identity.Topic()); err != nil || ns != e.identity.Namespace || pod != e.identity.Pod {
				t.Fatalf("accepted identity %q does not make a valid topic: %v", e.identity, err)
			}
			out.WriteString(e.token + " " + e.identity.String() + "\n")
		}
		again, err := parseTokens([]byte(out.String()))
		if err != nil {
			t.Fatalf("round trip refused: %v", err)
		}
		if len(again) != len(entries) {
			t.Fatalf("round trip: %d entries, want %d", len(again), len(entries))
		}
		for i := range again {
			if again[i].token != entries[i].token || again[i].identity != entries[i].identity {
				t.Fatalf("round trip changed entry %d", i)
			}
		}
	})
}
