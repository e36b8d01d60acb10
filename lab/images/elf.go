package images

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
)

// elfArch maps an ELF machine to the GOARCH of the image it runs in and to
// Debian's multiarch triplet, which names that architecture's library
// folders (/lib/x86_64-linux-gnu, ...).
func elfArch(m elf.Machine) (goarch, triplet string, ok bool) {
	switch m {
	case elf.EM_X86_64:
		return "amd64", "x86_64-linux-gnu", true
	case elf.EM_AARCH64:
		return "arm64", "aarch64-linux-gnu", true
	case elf.EM_386:
		return "386", "i386-linux-gnu", true
	case elf.EM_ARM:
		return "arm", "arm-linux-gnueabihf", true
	case elf.EM_RISCV:
		return "riscv64", "riscv64-linux-gnu", true
	case elf.EM_PPC64:
		return "ppc64le", "powerpc64le-linux-gnu", true
	case elf.EM_S390:
		return "s390x", "s390x-linux-gnu", true
	}
	return "", "", false
}

// dynamicDeps is what a dynamically linked program needs to start.
type dynamicDeps struct {
	Arch   string   // GOARCH of the program
	Interp string   // the dynamic loader (PT_INTERP), "" for a static program
	Libs   []string // shared libraries, as host paths the loader finds them at
}

// sharedLibraries reads bin's ELF headers and returns its loader and the
// transitive closure of its DT_NEEDED libraries, resolved the way glibc's
// loader resolves them in an image without /etc/ld.so.cache: the needing
// object's DT_RUNPATH (or DT_RPATH), then the loader's built-in folders
// /lib/<triplet>, /usr/lib/<triplet>, /lib, /usr/lib. A library only found
// through ld.so.conf (e.g. under /usr/local/lib) is an error, as the program
// would not start in the image.
//
// dlopened are sonames the program loads at run time without DT_NEEDED
// (resolved and followed like the others).
func sharedLibraries(bin string, dlopened ...string) (dynamicDeps, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return dynamicDeps{}, fmt.Errorf("read ELF headers of %s: %w", bin, err)
	}
	defer f.Close()
	arch, triplet, ok := elfArch(f.Machine)
	if !ok {
		return dynamicDeps{}, fmt.Errorf("%s: ELF machine %v has no known Debian multiarch folder", bin, f.Machine)
	}
	deps := dynamicDeps{Arch: arch}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return deps, fmt.Errorf("%s: read PT_INTERP: %w", bin, err)
			}
			deps.Interp = strings.TrimRight(string(b), "\x00")
		}
	}
	system := []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib", "/usr/lib"}

	type need struct{ soname, from string }
	var queue []need
	enqueue := func(obj string, ef *elf.File) error {
		needed, err := ef.DynString(elf.DT_NEEDED)
		if err != nil {
			return fmt.Errorf("%s: read DT_NEEDED: %w", obj, err)
		}
		for _, n := range needed {
			queue = append(queue, need{n, obj})
		}
		return nil
	}
	if err := enqueue(bin, f); err != nil {
		return deps, err
	}
	for _, so := range dlopened {
		queue = append(queue, need{so, bin})
	}
	// libc needs the loader by its soname; the loader satisfies that itself.
	found := map[string]bool{}
	if deps.Interp != "" {
		found[filepath.Base(deps.Interp)] = true
	}
	searchPath := map[string][]string{bin: objectSearchPath(bin, f, system)}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if found[n.soname] {
			continue
		}
		lib, lf, err := findLibrary(n.soname, searchPath[n.from], f)
		if err != nil {
			return deps, fmt.Errorf("%s (needed by %s): %w", n.soname, n.from, err)
		}
		found[n.soname] = true
		deps.Libs = append(deps.Libs, lib)
		searchPath[lib] = objectSearchPath(lib, lf, system)
		err = enqueue(lib, lf)
		lf.Close()
		if err != nil {
			return deps, err
		}
	}
	return deps, nil
}

// objectSearchPath is where the loader looks for the libraries obj needs.
func objectSearchPath(obj string, ef *elf.File, system []string) []string {
	var dirs []string
	paths, _ := ef.DynString(elf.DT_RUNPATH)
	if len(paths) == 0 {
		paths, _ = ef.DynString(elf.DT_RPATH)
	}
	for _, p := range paths {
		for _, d := range strings.Split(p, ":") {
			d = strings.ReplaceAll(d, "${ORIGIN}", filepath.Dir(obj))
			d = strings.ReplaceAll(d, "$ORIGIN", filepath.Dir(obj))
			if d != "" {
				dirs = append(dirs, d)
			}
		}
	}
	return append(dirs, system...)
}

// findLibrary returns the first file named soname in dirs that is an ELF
// object of main's class and machine (the loader skips others, e.g. a
// 32-bit library in /usr/lib), opened.
func findLibrary(soname string, dirs []string, main *elf.File) (string, *elf.File, error) {
	if strings.Contains(soname, "/") {
		dirs, soname = []string{filepath.Dir(soname)}, filepath.Base(soname)
	}
	for _, d := range dirs {
		p := filepath.Join(d, soname)
		lf, err := elf.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			var fe *elf.FormatError
			if errors.As(err, &fe) {
				continue // not ELF: the loader would skip it too
			}
			return "", nil, err
		}
		if lf.Class != main.Class || lf.Machine != main.Machine {
			lf.Close()
			continue
		}
		return p, lf, nil
	}
	return "", nil, fmt.Errorf("not found in %s (install the Debian package that has it; a library only ld.so.conf finds would not load in the image)", strings.Join(dirs, ":"))
}
