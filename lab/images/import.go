package images

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Namespace is containerd's namespace of the images the kubelet (CRI) sees.
const Namespace = "k8s.io"

// Import imports the archives into the containerd listening on address (its
// gRPC socket) with ctrPath ("" = "ctr" from PATH), unpacked into the default
// snapshotter as the CRI plugin expects, then checks with `ctr images check`
// that containerd has every ref, complete, unpacked and at the digest Build
// made: an archive whose name containerd does not read imports nothing and
// ctr exits 0 all the same. Importing an image again is harmless.
func Import(ctx context.Context, ctrPath, address string, images []Image) error {
	if ctrPath == "" {
		ctrPath = "ctr"
	}
	// ctr would spend 10 s trying to connect before saying the same.
	if _, err := os.Stat(address); err != nil {
		return fmt.Errorf("images: no containerd socket at %s: %w (is containerd running with this grpc address?)", address, err)
	}
	for _, img := range images {
		// ctr imports one archive per call. The archives hold one platform,
		// the host's, which ctr imports and unpacks without --platform.
		if _, err := ctr(ctx, ctrPath, address, "images", "import", img.Archive); err != nil {
			return fmt.Errorf("images: import %s into containerd at %s: %w", img.Ref, address, err)
		}
	}
	out, err := ctr(ctx, ctrPath, address, "images", "check")
	if err != nil {
		return fmt.Errorf("images: check containerd's images at %s after import: %w", address, err)
	}
	have := checkedImages(out)
	for _, img := range images {
		c, ok := have[img.Ref]
		switch {
		case !ok:
			return fmt.Errorf("images: %s imported from %s, but containerd at %s (namespace %s) does not list it", img.Ref, img.Archive, address, Namespace)
		case c.digest != img.Digest.String():
			return fmt.Errorf("images: containerd at %s has %s at %s, Build made %s", address, img.Ref, c.digest, img.Digest)
		case !c.complete || !c.unpacked:
			return fmt.Errorf("images: containerd at %s has %s incomplete or not unpacked (ctr images check: %q)", address, img.Ref, c.line)
		}
	}
	return nil
}

// checked is one line of `ctr images check`.
type checked struct {
	digest             string
	complete, unpacked bool
	line               string
}

// checkedImages parses `ctr images check` output by ref. Its columns are
// REF TYPE DIGEST STATUS SIZE UNPACKED, where STATUS ("complete (2/2)") and
// SIZE ("1.2 MiB/1.2 MiB") hold spaces.
func checkedImages(out []byte) map[string]checked {
	refs := map[string]checked{}
	for i, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 4 {
			continue
		}
		refs[f[0]] = checked{digest: f[2], complete: f[3] == "complete", unpacked: f[len(f)-1] == "true", line: strings.TrimSpace(line)}
	}
	return refs
}

func ctr(ctx context.Context, ctrPath, address string, args ...string) ([]byte, error) {
	args = append([]string{"--address", address, "--namespace", Namespace}, args...)
	c := exec.CommandContext(ctx, ctrPath, args...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", ctrPath, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
