package depcheck

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/amf-edge/amf/"

// rooms are the module's packages by what they serve, the shared ones
// lowest. A product package may import its own room's packages and the
// shared ones; the shared ones import only each other; nothing in the
// product imports the lab or a command. A package in no room fails the
// test, so a new one is placed here on purpose.
var rooms = map[string][]string{
	// Used by both binaries or by the lab beside them: the vocabulary, the
	// wire contract, the readers and the detector.
	"shared":  {"contract", "podsignal", "cgroup", "pause", "netns", "mosquittodb", "statehub", "detect", "infer", "infer/", "healthcheck", "internal/"},
	"sidecar": {"sidecar", "sidecar/"},
	"agent":   {"agent", "actuate", "brokerpod", "cluster", "cluster/", "liveness", "nodewatch", "inject", "connkill"},
	"images":  {"ociimage"},
	"lab":     {"lab", "lab/", "tools/"},
	"cmd":     {"cmd/"},
	// Its Go files are tests and the doc; the layouts are YAML.
	"manifests": {"manifests"},
}

// may says which rooms a room's packages may import, beside their own.
var may = map[string][]string{
	"shared":    nil,
	"sidecar":   {"shared"},
	"agent":     {"shared"},
	"images":    {"shared"},
	"manifests": {"shared"},
	"lab":       {"shared", "sidecar", "agent", "images"},
	"cmd":       {"shared", "sidecar", "agent", "images", "lab"},
}

func roomOf(pkg string) string {
	rel := strings.TrimPrefix(pkg, module)
	for room, prefixes := range rooms {
		for _, p := range prefixes {
			if rel == p || strings.HasSuffix(p, "/") && strings.HasPrefix(rel, p) {
				return room
			}
		}
	}
	return ""
}

// TestImportsPointDown: every import of the module's non-test code goes to
// its own room or one below it (rooms, may), and no command imports
// another command.
func TestImportsPointDown(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH: cannot list packages")
	}
	cmd := exec.Command("go", "list", "-json", module+"...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	n := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
		from := roomOf(p.ImportPath)
		if from == "" {
			t.Errorf("%s is in no room: add it to rooms", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			to := roomOf(imp)
			switch {
			case to == "":
				t.Errorf("%s imports %s, which is in no room", p.ImportPath, imp)
			case from == "cmd" && to == "cmd":
				t.Errorf("%s imports another command, %s", p.ImportPath, imp)
			case to != from && !contains(may[from], to):
				t.Errorf("%s (%s) imports %s (%s): against the grain", p.ImportPath, from, imp, to)
			}
		}
	}
	if n < 30 {
		t.Fatalf("go list gave %d packages: not the module", n)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
