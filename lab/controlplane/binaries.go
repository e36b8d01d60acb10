package controlplane

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Environment variables read by this package.
const (
	// EnvBin names the folder holding the binaries (overrides the cache folder).
	EnvBin = "AMF_K8S_BIN"
	// EnvCache names the cache root that `make k8s` builds into (default: the
	// user's cache folder, ~/.cache/amf/k8s, so every clone on a machine shares one build).
	EnvCache = "AMF_K8S_CACHE"
	// EnvRequire, set to 1, turns a missing control plane into a test failure.
	EnvRequire = "AMF_REQUIRE_K8S"
)

const productModule = "github.com/amf-edge/amf"

// binaries are the executables Start needs, in a bin folder made by tools/k8s/build.sh.
var binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok"}

// kwokStages are the stage files (relative to <bin>/kwok-stage) kwok runs with: nodes
// become Ready at once and keep a lease; pods become Running/Ready at once, complete
// and are deleted as a kubelet would.
var kwokStages = []string{
	"node/fast/node-initialize.yaml",
	"node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
	"pod/fast/pod-ready.yaml",
	"pod/fast/pod-complete.yaml",
	"pod/fast/pod-delete.yaml",
}

// BinDir returns the folder the binaries are expected in: $AMF_K8S_BIN, else
// <cache>/<k8s version of tools/k8s/go.mod>/bin with <cache> = $AMF_K8S_CACHE or
// ~/.cache/amf/k8s. The repository is found from the working directory upwards.
func BinDir() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		return d, nil
	}
	repo, err := repoRoot()
	if err != nil {
		return "", err
	}
	version, err := pinnedVersion(filepath.Join(repo, "tools", "k8s", "go.mod"))
	if err != nil {
		return "", err
	}
	cache := os.Getenv(EnvCache)
	if cache == "" {
		userCache, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache folder for the Kubernetes binaries: %w (set %s)", err, EnvCache)
		}
		cache = filepath.Join(userCache, "amf", "k8s")
	}
	return filepath.Join(cache, version, "bin"), nil
}

// checkBinDir reports the first binary or stage file missing from dir.
func checkBinDir(dir string) error {
	for _, b := range binaries {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("no %s in %s", b, dir)
		}
	}
	for _, s := range kwokStages {
		if _, err := os.Stat(filepath.Join(dir, "kwok-stage", s)); err != nil {
			return fmt.Errorf("no kwok stage %s in %s", s, filepath.Join(dir, "kwok-stage"))
		}
	}
	return nil
}

// repoRoot walks up from the working directory to the product module's root.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(b) == productModule {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root (go.mod of " + productModule + ") not found above the working directory")
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// pinnedVersion reads the k8s.io/kubernetes version required by tools/k8s/go.mod.
func pinnedVersion(gomod string) (string, error) { return RequiredVersion(gomod, "k8s.io/kubernetes") }

// RequiredVersion reads the version of module that the go.mod file at gomod
// requires (a tool module's pin: tools/k8s, tools/containerd).
func RequiredVersion(gomod, module string) (string, error) {
	b, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == module && strings.HasPrefix(f[1], "v") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s does not require %s", gomod, module)
}
