package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// tokenFile is a projected ServiceAccount token the node keeps fresh.
type tokenFile struct {
	path      string
	mode      os.FileMode
	gid       int // -1: leave
	src       corev1.ServiceAccountTokenProjection
	refreshAt time.Time
}

// volumeState is what prepareVolumes made, kept for the token refresher.
type volumeState struct {
	mu     sync.Mutex
	tokens []*tokenFile
}

// prepareVolumes writes the pod's volumes under <pod dir>/volumes/<name> (or
// resolves hostPath ones) and returns each volume's host directory.
func (p *pod) prepareVolumes(ctx context.Context, api *corev1.Pod) (map[string]string, error) {
	dirs := map[string]string{}
	var tokens []*tokenFile
	fsGroup := -1
	if sc := api.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		fsGroup = int(*sc.FSGroup)
	}
	objs := &apiObjects{ctx: ctx, n: p.n, ns: p.ns}
	for _, v := range api.Spec.Volumes {
		dir := filepath.Join(p.dir, "volumes", v.Name)
		w := &volumeWriter{dir: dir, gid: fsGroup}
		var err error
		switch {
		case v.EmptyDir != nil:
			err = mkdirMode(dir, 0o777)
		case v.HostPath != nil:
			dir, err = hostPathDir(v.HostPath)
		case v.ConfigMap != nil:
			w.mode = modeOr(v.ConfigMap.DefaultMode, 0o644)
			err = w.configMap(objs, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
		case v.Secret != nil:
			w.mode = modeOr(v.Secret.DefaultMode, 0o644)
			err = w.secret(objs, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
		case v.DownwardAPI != nil:
			w.mode = modeOr(v.DownwardAPI.DefaultMode, 0o644)
			err = w.downward(api, v.DownwardAPI.Items, p.n.facts)
		case v.Projected != nil:
			w.mode = modeOr(v.Projected.DefaultMode, 0o644)
			var ts []*tokenFile
			ts, err = p.projected(ctx, api, w, objs, v.Projected.Sources)
			tokens = append(tokens, ts...)
		default:
			err = errors.New("volume type not supported by the lab node (it supports configMap, secret, emptyDir, hostPath, downwardAPI, projected)")
		}
		if err != nil {
			return nil, fmt.Errorf("volume %q: %w", v.Name, err)
		}
		dirs[v.Name] = dir
	}
	p.tokens.mu.Lock()
	p.tokens.tokens = tokens
	p.tokens.mu.Unlock()
	return dirs, nil
}

// rewrites are the container's path rewrites: each volumeMount's mountPath →
// the volume's host directory (joined with subPath).
func (p *pod) rewrites(c *corev1.Container) ([]rewrite, error) {
	p.mu.Lock()
	vols := p.volumes
	p.mu.Unlock()
	m := map[string]string{}
	for _, vm := range c.VolumeMounts {
		dir, ok := vols[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %q: no volume of that name", vm.Name)
		}
		if vm.SubPath != "" {
			sub := path.Clean("/" + vm.SubPath)
			dir = filepath.Join(dir, filepath.FromSlash(sub))
		}
		m[vm.MountPath] = dir
	}
	return newRewrites(m), nil
}

func modeOr(m *int32, def os.FileMode) os.FileMode {
	if m != nil {
		return os.FileMode(*m) & 0o777
	}
	return def
}

func mkdirMode(dir string, mode os.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.Chmod(dir, mode) // MkdirAll is subject to the umask
}

func hostPathDir(h *corev1.HostPathVolumeSource) (string, error) {
	p := filepath.Clean(h.Path)
	t := corev1.HostPathUnset
	if h.Type != nil {
		t = *h.Type
	}
	fi, err := os.Stat(p)
	switch t {
	case corev1.HostPathDirectoryOrCreate:
		if errors.Is(err, fs.ErrNotExist) {
			return p, os.MkdirAll(p, 0o755)
		}
	case corev1.HostPathFileOrCreate:
		if errors.Is(err, fs.ErrNotExist) {
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return "", err
			}
			return p, f.Close()
		}
	case corev1.HostPathUnset:
		return p, nil
	}
	if err != nil {
		return "", fmt.Errorf("hostPath %s: %w", p, err)
	}
	switch t {
	case corev1.HostPathDirectory, corev1.HostPathDirectoryOrCreate:
		if !fi.IsDir() {
			return "", fmt.Errorf("hostPath %s is not a directory", p)
		}
	case corev1.HostPathFile, corev1.HostPathFileOrCreate:
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("hostPath %s is not a file", p)
		}
	}
	return p, nil
}

// volumeWriter writes the files of one volume.
type volumeWriter struct {
	dir  string
	mode os.FileMode
	gid  int
}

// write writes a file of the volume atomically (rename), so a reader never
// sees half a token.
func (w *volumeWriter) write(rel string, data []byte, mode *int32) error {
	rel = path.Clean("/" + rel)
	if rel == "/" {
		return errors.New("empty file path")
	}
	dst := filepath.Join(w.dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	m := w.mode
	if mode != nil {
		m = os.FileMode(*mode) & 0o777
	}
	return writeAtomic(dst, data, m, w.gid)
}

func writeAtomic(dst string, data []byte, mode os.FileMode, gid int) error {
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".tmp-"+filepath.Base(dst)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), mode); err != nil {
		return err
	}
	if gid >= 0 {
		if err := os.Chown(tmp.Name(), -1, gid); err != nil {
			return err
		}
	}
	return os.Rename(tmp.Name(), dst)
}

func (w *volumeWriter) keys(data map[string][]byte, items []corev1.KeyToPath, what string) error {
	if err := mkdirMode(w.dir, 0o755); err != nil {
		return err
	}
	if len(items) == 0 {
		for _, k := range sortedKeys(data) {
			if err := w.write(k, data[k], nil); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("%s has no key %q", what, it.Key)
		}
		if err := w.write(it.Path, v, it.Mode); err != nil {
			return err
		}
	}
	return nil
}

func (w *volumeWriter) configMap(objs objectSource, name string, items []corev1.KeyToPath, opt *bool) error {
	cm, err := objs.configMap(name)
	if err != nil {
		if isNotFound(err) && optional(opt) {
			return mkdirMode(w.dir, 0o755)
		}
		return fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return w.keys(data, items, "configmap "+name)
}

func (w *volumeWriter) secret(objs objectSource, name string, items []corev1.KeyToPath, opt *bool) error {
	s, err := objs.secret(name)
	if err != nil {
		if isNotFound(err) && optional(opt) {
			return mkdirMode(w.dir, 0o755)
		}
		return fmt.Errorf("secret %q: %w", name, err)
	}
	return w.keys(s.Data, items, "secret "+name)
}

func (w *volumeWriter) downward(api *corev1.Pod, items []corev1.DownwardAPIVolumeFile, facts podFacts) error {
	if err := mkdirMode(w.dir, 0o755); err != nil {
		return err
	}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = fieldValue(api, it.FieldRef.FieldPath, facts)
		case it.ResourceFieldRef != nil:
			c := findContainer(api, it.ResourceFieldRef.ContainerName)
			if c == nil {
				return fmt.Errorf("downwardAPI %s: no container %q", it.Path, it.ResourceFieldRef.ContainerName)
			}
			v, err = resourceValue(c, it.ResourceFieldRef, facts.allocatable)
		default:
			err = errors.New("no field")
		}
		if err != nil {
			return fmt.Errorf("downwardAPI %s: %w", it.Path, err)
		}
		if err := w.write(it.Path, []byte(v), it.Mode); err != nil {
			return err
		}
	}
	return nil
}

// projected writes a projected volume's sources into one directory.
func (p *pod) projected(ctx context.Context, api *corev1.Pod, w *volumeWriter, objs objectSource, srcs []corev1.VolumeProjection) ([]*tokenFile, error) {
	if err := mkdirMode(w.dir, 0o755); err != nil {
		return nil, err
	}
	var tokens []*tokenFile
	for _, s := range srcs {
		switch {
		case s.ServiceAccountToken != nil:
			t := &tokenFile{path: filepath.Join(w.dir, filepath.FromSlash(path.Clean("/"+s.ServiceAccountToken.Path))), mode: w.mode, gid: w.gid, src: *s.ServiceAccountToken}
			if err := p.writeToken(ctx, api, t); err != nil {
				return nil, err
			}
			tokens = append(tokens, t)
		case s.ConfigMap != nil:
			if err := w.configMap(objs, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional); err != nil {
				return nil, err
			}
		case s.Secret != nil:
			if err := w.secret(objs, s.Secret.Name, s.Secret.Items, s.Secret.Optional); err != nil {
				return nil, err
			}
		case s.DownwardAPI != nil:
			if err := w.downward(api, s.DownwardAPI.Items, p.n.facts); err != nil {
				return nil, err
			}
		default:
			return nil, errors.New("projected source not supported by the lab node (it supports serviceAccountToken, configMap, secret, downwardAPI)")
		}
	}
	return tokens, nil
}

// writeToken requests a token for the pod's ServiceAccount, bound to the pod,
// writes it and schedules its refresh at 80 % of its lifetime (the kubelet's
// rule). The token itself is never logged.
func (p *pod) writeToken(ctx context.Context, api *corev1.Pod, t *tokenFile) error {
	exp := int64(3600)
	if t.src.ExpirationSeconds != nil {
		exp = *t.src.ExpirationSeconds
	}
	var aud []string
	if t.src.Audience != "" {
		aud = []string{t.src.Audience}
	}
	sa := api.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         aud,
		ExpirationSeconds: ptr.To(exp),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: api.Name, UID: api.UID},
	}}
	issued := p.n.clock.Now()
	tr, err := p.n.cfg.Client.CoreV1().ServiceAccounts(p.ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for serviceaccount %s (audience %q): %w", sa, t.src.Audience, err)
	}
	if err := writeAtomic(t.path, []byte(tr.Status.Token), t.mode, t.gid); err != nil {
		return err
	}
	life := tr.Status.ExpirationTimestamp.Sub(issued)
	if life <= 0 {
		life = time.Duration(exp) * time.Second
	}
	t.refreshAt = issued.Add(life * 8 / 10)
	return nil
}

// refreshTokens rewrites each projected token when it reaches 80 % of its
// lifetime, until ctx ends; a failed request is retried after 10 s.
func (p *pod) refreshTokens(ctx context.Context) {
	for {
		p.tokens.mu.Lock()
		var next *tokenFile
		for _, t := range p.tokens.tokens {
			if next == nil || t.refreshAt.Before(next.refreshAt) {
				next = t
			}
		}
		p.tokens.mu.Unlock()
		if next == nil {
			return
		}
		if !sleep(ctx, p.n.clock, next.refreshAt.Sub(p.n.clock.Now()), nil) {
			return
		}
		p.tokens.mu.Lock()
		err := p.writeToken(ctx, p.apiPod(), next)
		if err != nil {
			next.refreshAt = p.n.clock.Now().Add(10 * time.Second)
		}
		p.tokens.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			p.log.Warn("refresh token, retrying in 10s", "file", next.path, "err", err)
		} else if err == nil {
			p.log.Debug("token refreshed", "file", next.path, "next", next.refreshAt)
		}
	}
}
