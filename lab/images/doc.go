// Package images builds the container images of the lab's kubelet + containerd
// node, which can pull nothing: every image a test pod runs is built here, on
// the host, and imported into containerd (Import runs `ctr images import`).
//
// Build writes one OCI image archive per image (a tar of an OCI image
// layout, the format `ctr images import` reads), for linux and the host's
// GOARCH:
//
//   - PauseRef: the pod sandbox, the program in ./pause as user 65535;
//   - MosquittoRef: Debian's mosquitto as installed on the host, with its
//     shared libraries, laid out like the eclipse-mosquitto image so that
//     manifests written for that image run unchanged, plus the lab's
//     amf-lab binary (its fault injector runs inside the broker container);
//   - the project's amf-sidecar and amf-agent, as ociimage builds them,
//     under the refs manifests/ deploy;
//   - LabRef: amf-lab alone, for the E2E probe run as a pod.
//
// Archives are cached in Options.CacheDir under a key hashed from everything
// the image is made of (file contents, modes, owners, config), and
// timestamps are the epoch: unchanged inputs give the same archive, which a
// later Build finds and does not write again.
//
// It is test infrastructure (under lab/): product code never imports it.
package images
