package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// v1 controllers a broker cgroup is made in, as a container runtime would.
var benchControllers = [...]string{"memory", "cpuacct", "blkio"}

// makeBrokerCgroup creates a cgroup v1 group with the testbed's 100 MiB limit for
// the broker, so that broker restarts keep the sidecar's target. It returns the
// memory controller's directory, or "" when cgroup v1 is not writable here (not
// root, or cgroup v2): the sidecar then samples the lab process instead.
func makeBrokerCgroup(workDir string) string {
	name := fmt.Sprintf("amf-lab-%d-%s", os.Getpid(), filepath.Base(workDir))
	var made []string
	for _, c := range benchControllers {
		dir := filepath.Join("/sys/fs/cgroup", c, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			for _, d := range made {
				_ = os.Remove(d)
			}
			return ""
		}
		made = append(made, dir)
	}
	mem := made[0]
	_ = os.WriteFile(filepath.Join(mem, "memory.limit_in_bytes"), []byte(strconv.Itoa(100<<20)), 0o644)
	return mem
}

// addToCgroup moves pid into every controller's group named like memDir.
func addToCgroup(memDir string, pid int) error {
	name := filepath.Base(memDir)
	for _, c := range benchControllers {
		p := filepath.Join("/sys/fs/cgroup", c, name, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move broker into %s: %w", p, err)
		}
	}
	return nil
}

func removeBrokerCgroup(memDir string) {
	name := filepath.Base(memDir)
	for _, c := range benchControllers {
		_ = os.Remove(filepath.Join("/sys/fs/cgroup", c, name))
	}
}
