package images

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// MosquittoUser is the uid and gid of user mosquitto in the eclipse-mosquitto
// image, which manifests and volume permissions written for it expect.
const MosquittoUser = 1883

// Paths of the eclipse-mosquitto image's layout.
const (
	MosquittoBinary = "/usr/sbin/mosquitto"
	MosquittoConfig = "/mosquitto/config/mosquitto.conf"
	// LabBinary is where the mosquitto image holds amf-lab, whose fault
	// injector is exec'd in the broker container.
	LabBinary = "/usr/local/bin/amf-lab"
	// MosquittoSub is the MQTT client the eclipse-mosquitto image ships
	// beside its broker, and what users of that image run as an MQTT-level
	// exec liveness probe (mosquitto_sub -t '$SYS/#' -C 1 -W 3): a tcpSocket
	// probe passes against a frozen broker, whose kernel still completes the
	// handshake.
	MosquittoSub = "/usr/bin/mosquitto_sub"
)

// mosquittoConf is the image's default config: the Eclipse image's stock
// file listens on localhost only, which no pod can reach; this is what the
// lab's brokers run with unless a ConfigMap replaces it.
const mosquittoConf = `# amf.lab/mosquitto default: one plain MQTT listener, no authentication.
listener 1883
allow_anonymous true
`

const (
	passwd = "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"mosquitto:x:1883:1883:mosquitto:/var/empty:/usr/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group = "root:x:0:\n" +
		"mosquitto:x:1883:\n" +
		"nogroup:x:65534:\n"
	// Without nsswitch.conf glibc may try the compat module, which is not
	// built into libc and not in the image.
	nsswitch = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
)

// debianPackage is what dpkg knows of an installed package.
type debianPackage struct {
	Name, Version, Arch string
}

// mosquittoRecipe is Debian's mosquitto at bin (a file of the mosquitto
// package) and its mosquitto_sub at sub (of mosquitto-clients: Debian splits
// the clients off, the eclipse image has both), with the transitive closure
// of their shared libraries and the loader, laid out like eclipse-mosquitto,
// plus amf-lab (labBin).
func mosquittoRecipe(arch, bin, sub string, labBin []byte) (recipe, error) {
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto: %w (install Debian's mosquitto package: make deps)", err)
	}
	pkg, err := dpkgOwner("/var/lib/dpkg", "mosquitto", real)
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto at %s: %w", bin, err)
	}
	// The ref's tag names the upstream version: keep it honest.
	want := strings.TrimSuffix(MosquittoRef[strings.LastIndex(MosquittoRef, ":")+1:], "-debian")
	if got := upstreamVersion(pkg.Version); got != want {
		return recipe{}, fmt.Errorf("images: mosquitto at %s is Debian's %s, but MosquittoRef (%s) says %s: change MosquittoRef to match the installed package",
			bin, pkg.Version, MosquittoRef, want)
	}
	// glibc dlopens libgcc_s at pthread_exit and cancellation (Mosquitto's
	// bridges run threads): without it the broker aborts with "libgcc_s.so.1
	// must be installed for pthread_exit to work".
	deps, err := sharedLibraries(real, "libgcc_s.so.1")
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto: %w", err)
	}
	realSub, err := filepath.EvalSymlinks(sub)
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto_sub: %w (install Debian's mosquitto-clients package: make deps)", err)
	}
	subPkg, err := dpkgOwner("/var/lib/dpkg", "mosquitto-clients", realSub)
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto_sub at %s: %w", sub, err)
	}
	if subPkg.Version != pkg.Version {
		return recipe{}, fmt.Errorf("images: mosquitto-clients %s and mosquitto %s differ: install both from the same release (make deps)", subPkg.Version, pkg.Version)
	}
	subDeps, err := sharedLibraries(realSub)
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto_sub: %w", err)
	}
	if deps.Arch != arch {
		return recipe{}, fmt.Errorf("images: mosquitto at %s is a linux/%s program, the images are linux/%s", bin, deps.Arch, arch)
	}
	if deps.Interp == "" {
		return recipe{}, fmt.Errorf("images: mosquitto at %s has no dynamic loader (PT_INTERP); a Debian build always has one", bin)
	}

	t := newTree()
	data, err := os.ReadFile(real)
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto: %w", err)
	}
	subData, err := os.ReadFile(realSub)
	if err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto_sub: %w", err)
	}
	errs := []error{
		t.file(MosquittoBinary, 0o755, 0, 0, data),
		t.file(MosquittoSub, 0o755, 0, 0, subData),
		t.hostFile(deps.Interp),
		t.hostFile(subDeps.Interp),
	}
	// Libraries both need are the same host files: the tree keeps one.
	for _, lib := range append(deps.Libs, subDeps.Libs...) {
		errs = append(errs, t.hostFile(lib))
	}
	m := MosquittoUser
	errs = append(errs,
		t.file("/etc/passwd", 0o644, 0, 0, []byte(passwd)),
		t.file("/etc/group", 0o644, 0, 0, []byte(group)),
		t.file("/etc/nsswitch.conf", 0o644, 0, 0, []byte(nsswitch)),
		t.dir("/mosquitto", 0o755, m, m),
		t.dir("/mosquitto/config", 0o755, m, m),
		t.dir("/mosquitto/data", 0o755, m, m),
		t.dir("/mosquitto/log", 0o755, m, m),
		t.file(MosquittoConfig, 0o644, m, m, []byte(mosquittoConf)),
		t.file(LabBinary, 0o755, 0, 0, labBin),
	)
	if err := errors.Join(errs...); err != nil {
		return recipe{}, fmt.Errorf("images: mosquitto: %w", err)
	}

	return treeRecipe(Mosquitto, MosquittoRef, arch, t, v1.Config{
		Entrypoint:   []string{MosquittoBinary},
		Cmd:          []string{"-c", MosquittoConfig},
		User:         fmt.Sprintf("%d:%d", m, m),
		WorkingDir:   "/",
		Env:          []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		ExposedPorts: map[string]struct{}{"1883/tcp": {}},
		Volumes:      map[string]struct{}{"/mosquitto/data": {}, "/mosquitto/log": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "mosquitto",
			"org.opencontainers.image.version":     pkg.Version,
			"org.opencontainers.image.description": "Debian's mosquitto broker laid out like eclipse-mosquitto, for AMF's lab; not the Eclipse build",
			"amf.lab.built-from": fmt.Sprintf("Debian packages %s and %s %s (%s) as installed on %s: %s and %s with %d and %d shared libraries and %s from the same system; %s added by lab/images",
				pkg.Name, subPkg.Name, pkg.Version, pkg.Arch, osRelease("/etc/os-release"), real, realSub, len(deps.Libs), len(subDeps.Libs), deps.Interp, LabBinary),
		},
	})
}

// dpkgOwner checks in dpkg's database at dir that file belongs to the
// installed package name, and returns the package.
func dpkgOwner(dir, name, file string) (debianPackage, error) {
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return debianPackage{}, fmt.Errorf("not from a Debian package: %w", err)
	}
	pkg, ok := dpkgStatus(status, name)
	if !ok {
		return pkg, fmt.Errorf("package %s is not installed (make deps installs it)", name)
	}
	for _, list := range []string{name + ".list", name + ":" + pkg.Arch + ".list"} {
		b, err := os.ReadFile(filepath.Join(dir, "info", list))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line == file {
				return pkg, nil
			}
		}
	}
	return pkg, fmt.Errorf("%s is not a file of Debian's package %s; the image's tag promises Debian's build", file, name)
}

// dpkgStatus finds the installed package name in a dpkg status file.
func dpkgStatus(status []byte, name string) (debianPackage, bool) {
	for _, stanza := range bytes.Split(status, []byte("\n\n")) {
		fields := map[string]string{}
		sc := bufio.NewScanner(bytes.NewReader(stanza))
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ": ")
			if ok && !strings.HasPrefix(k, " ") {
				fields[k] = v
			}
		}
		if fields["Package"] == name && strings.HasSuffix(fields["Status"], " installed") {
			return debianPackage{Name: name, Version: fields["Version"], Arch: fields["Architecture"]}, true
		}
	}
	return debianPackage{}, false
}

// upstreamVersion is a Debian version without its epoch and Debian revision:
// 2.0.11 of 2.0.11-1.2+deb12u2.
func upstreamVersion(v string) string {
	if _, rest, ok := strings.Cut(v, ":"); ok {
		v = rest
	}
	if i := strings.LastIndex(v, "-"); i >= 0 {
		v = v[:i]
	}
	return v
}

// osRelease is the host system's name for the image's label.
func osRelease(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "an unknown system"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return "an unknown system"
}
