// Command amf-images builds the multi-arch (linux/amd64, linux/arm64) OCI
// images of amf-sidecar and amf-agent FROM scratch into an OCI image layout
// directory, without a Docker daemon.
//
//	go run ./cmd/amf-images --out bin/images
//
// By default it cross-compiles the binaries itself (static, trimmed,
// stripped); --bin-dir uses prebuilt ones at <bin-dir>/linux-<arch>/<cmd>.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/amf-edge/amf/ociimage"
)

func main() {
	var opts ociimage.Options
	var cmds, arches string
	flag.StringVar(&opts.Out, "out", "bin/images", "OCI image layout directory")
	flag.StringVar(&opts.Registry, "registry", ociimage.DefaultRegistry, "registry/namespace of the image names")
	flag.StringVar(&opts.Tag, "tag", ociimage.DefaultTag, "image tag")
	flag.StringVar(&cmds, "cmds", strings.Join(ociimage.DefaultCommands, ","), "commands under ./cmd to package")
	flag.StringVar(&arches, "arches", strings.Join(ociimage.DefaultArches, ","), "linux architectures")
	flag.StringVar(&opts.BinDir, "bin-dir", "", "prebuilt binaries at DIR/linux-<arch>/<cmd> (default: go build into a temp dir)")
	flag.Parse()
	opts.Commands = strings.Split(cmds, ",")
	opts.Arches = strings.Split(arches, ",")

	res, err := ociimage.Build(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "amf-images:", err)
		os.Exit(1)
	}
	for _, r := range res {
		fmt.Printf("%s %s\n", r.Ref, r.Digest)
		for _, a := range opts.Arches {
			fmt.Printf("  linux/%-6s %8.2f MiB\n", a, float64(r.Sizes[a])/(1<<20))
		}
	}
	fmt.Printf("wrote OCI layout %s\n", opts.Out)
}
