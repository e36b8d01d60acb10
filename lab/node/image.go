package node

import "strings"

// Image is what a container image would run: the lab node has no images, so
// Config.Images maps each image repository to a local program.
type Image struct {
	// Entrypoint and Cmd are the image's ENTRYPOINT and CMD; the container's
	// command replaces Entrypoint (and drops Cmd), its args replace Cmd.
	// Entrypoint[0] (or command[0]) is a local executable: an absolute path,
	// or a name looked up in the container's PATH.
	Entrypoint, Cmd []string
	// Env is the image's environment (KEY=value), overridden by the container's.
	Env []string
	// WorkingDir is the image's working directory (default "/").
	WorkingDir string
}

// imageRepository strips the tag and the digest from an image reference:
// "eclipse-mosquitto:2.0.20" → "eclipse-mosquitto",
// "localhost:5000/a/b:v1@sha256:..." → "localhost:5000/a/b".
func imageRepository(ref string) string {
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		ref = ref[:i]
	}
	return ref
}

// repositoryAliases lists the spellings of a Docker Hub repository, so that a
// mapping of "eclipse-mosquitto" also serves "docker.io/library/eclipse-mosquitto".
func repositoryAliases(repo string) []string {
	out := []string{repo}
	short := repo
	for _, p := range []string{"docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/"} {
		if s, ok := strings.CutPrefix(repo, p); ok {
			short = s
			break
		}
	}
	if short != repo {
		out = append(out, short)
	}
	if first, _, ok := strings.Cut(short, "/"); !ok || !strings.ContainsAny(first, ".:") && first != "localhost" {
		if !ok {
			out = append(out, "docker.io/library/"+short)
		} else {
			out = append(out, "docker.io/"+short)
		}
	}
	return out
}

// lookupImage finds the mapping of an image reference.
func lookupImage(images map[string]Image, ref string) (Image, string, bool) {
	repo := imageRepository(ref)
	for _, r := range repositoryAliases(repo) {
		if img, ok := images[r]; ok {
			return img, r, true
		}
	}
	return Image{}, repo, false
}
