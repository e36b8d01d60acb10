// Package arm64 is the project's home for cross builds and container images:
// static linux/amd64 and linux/arm64 binaries of the commands in ./cmd and the
// multi-arch OCI images built from them without a Docker daemon (see
// arm64/images and arm64/cmd/amf-images).
package arm64
