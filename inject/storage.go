package inject

// What a standby copied from its primary would share with it, and what
// Inject does about each (DESIGN.md, "Broker state"):
//
//   - a PersistentVolumeClaim mounted writable: two live brokers cannot
//     share one persistence file, and a ReadWriteOnce claim attaches to one
//     node, so a standby kept off its primary's node would never start. The
//     standby gets a claim of its own, of the same class, size, access
//     modes and volume mode, written after it; a claim that is not in the
//     input cannot be copied and is refused, saying how to include it;
//   - a claim every container mounts read-only is shared, and said;
//   - ConfigMaps and Secrets are shared, and said by name: they may set
//     MQTT client IDs, which two brokers running at once must not share.

import (
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// claimVolumes are the volumes of spec that mount a PersistentVolumeClaim,
// with whether any container (init and native sidecars included) may write
// to it.
func claimVolumes(spec *corev1.PodSpec) (vols []corev1.Volume, writable map[string]bool) {
	writable = map[string]bool{}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		vols = append(vols, v)
		if v.PersistentVolumeClaim.ReadOnly {
			continue
		}
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name && !m.ReadOnly {
					writable[v.Name] = true
				}
			}
		}
	}
	return vols, writable
}

// standbyClaimName is the claim a standby's volume gets: the StatefulSet
// convention, <volume>-<owner>.
func standbyClaimName(volume, standby string) string { return volume + "-" + standby }

// readClaims are the stream's PersistentVolumeClaims by namespace/name: a
// standby's own are copied from them.
func readClaims(docs []document) map[string]*corev1.PersistentVolumeClaim {
	claims := map[string]*corev1.PersistentVolumeClaim{}
	for _, d := range docs {
		if c := d.claim; c != nil {
			claims[key(c.Namespace, c.Name)] = c
		}
	}
	return claims
}

// ownClaim is a claim Inject writes for a standby, copied from the claim From.
type ownClaim struct {
	*corev1.PersistentVolumeClaim
	From string
}

// standbyClaims gives standby, just copied from primary, a claim of its own
// for every claim it would write to, from the claims of the input, which it
// adds them to. It returns the claims to write (none that the input already
// has), the names of the claims left shared (mounted read-only), and
// warnings about the claims written.
func standbyClaims(standby, primary *appsv1.Deployment, claims map[string]*corev1.PersistentVolumeClaim) (written []ownClaim, shared []string, warnings []string, err error) {
	spec := &standby.Spec.Template.Spec
	vols, writable := claimVolumes(spec)
	for _, v := range vols {
		name := v.PersistentVolumeClaim.ClaimName
		if !writable[v.Name] {
			shared = append(shared, "PersistentVolumeClaim "+name+" (read-only)")
			continue
		}
		own := standbyClaimName(v.Name, standby.Name)
		if claims[key(standby.Namespace, own)] == nil {
			src := claims[key(primary.Namespace, name)]
			if src == nil {
				return nil, nil, nil, fmt.Errorf("volume %q mounts PersistentVolumeClaim %q writable, which is not in the input: the standby needs a claim of its own "+
					"(two brokers cannot share one persistence file, and a ReadWriteOnce claim attaches to one node, where a standby kept off its primary's node never starts); "+
					"give the claim in the same input so that inject writes the standby %s of the same class and size "+
					"(kubectl get deployment/%s pvc/%s -o yaml | amf-agent inject --standby), or write that claim yourself and give it too",
					v.Name, name, own, primary.Name, name)
			}
			c := standbyClaim(src, own)
			claims[key(c.Namespace, own)] = c
			written = append(written, ownClaim{c, name})
			if sc := src.Spec.StorageClassName; sc != nil && *sc == "" {
				warnings = append(warnings, fmt.Sprintf("claim %s of standby %s has storageClassName \"\" as %s has: nothing provisions it; create a PersistentVolume for it before the standby first starts",
					own, standby.Name, name))
			}
			if src.Spec.Selector != nil {
				warnings = append(warnings, fmt.Sprintf("claim %s selects its PersistentVolume by label; claim %s of standby %s is written without that selector, so it gets a volume of its own class",
					name, own, standby.Name))
			}
		}
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == v.Name {
				spec.Volumes[i].PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: own}
			}
		}
	}
	return written, shared, warnings, nil
}

// standbyClaim is a new claim like src: its labels, access modes, class,
// requests and limits and volume mode. What binds src to its volume
// (volumeName, selector, the binder's annotations) and what fills it
// (dataSource) is src's own.
func standbyClaim(src *corev1.PersistentVolumeClaim, name string) *corev1.PersistentVolumeClaim {
	s := src.Spec
	return &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: src.Namespace, Labels: src.Labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      s.AccessModes,
			StorageClassName: s.StorageClassName,
			Resources:        s.Resources,
			VolumeMode:       s.VolumeMode,
		},
	}
}

// checkSharedClaim refuses a and b, a pair both in the input, when they
// mount one claim writable, naming the first.
func checkSharedClaim(a, b *appsv1.Deployment) error {
	va, wa := claimVolumes(&a.Spec.Template.Spec)
	vb, wb := claimVolumes(&b.Spec.Template.Spec)
	for _, x := range va {
		for _, y := range vb {
			if c := x.PersistentVolumeClaim.ClaimName; c == y.PersistentVolumeClaim.ClaimName && wa[x.Name] && wb[y.Name] {
				return fmt.Errorf("%s and %s, a pair, both mount PersistentVolumeClaim %q writable: two brokers cannot share one persistence file, and a ReadWriteOnce claim attaches to one node, where a standby kept off its primary's node never starts; "+
					"give the standby a claim of its own (remove the standby from the input and inject --standby writes it one, with the claim in the input)", a.Name, b.Name, c)
			}
		}
	}
	return nil
}

// sharedConfig names the ConfigMaps and Secrets the pod template refers to
// (volumes, projected sources, env and envFrom), sorted.
func sharedConfig(spec *corev1.PodSpec) []string {
	var names []string
	add := func(kind, name string) {
		if s := kind + " " + name; name != "" && !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			add("ConfigMap", v.ConfigMap.Name)
		}
		if v.Secret != nil {
			add("Secret", v.Secret.SecretName)
		}
		if v.Projected != nil {
			for _, p := range v.Projected.Sources {
				if p.ConfigMap != nil {
					add("ConfigMap", p.ConfigMap.Name)
				}
				if p.Secret != nil {
					add("Secret", p.Secret.Name)
				}
			}
		}
	}
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
		for _, e := range c.EnvFrom {
			if e.ConfigMapRef != nil {
				add("ConfigMap", e.ConfigMapRef.Name)
			}
			if e.SecretRef != nil {
				add("Secret", e.SecretRef.Name)
			}
		}
		for _, e := range c.Env {
			if f := e.ValueFrom; f != nil {
				if f.ConfigMapKeyRef != nil {
					add("ConfigMap", f.ConfigMapKeyRef.Name)
				}
				if f.SecretKeyRef != nil {
					add("Secret", f.SecretKeyRef.Name)
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// recreateWarning says what strategy Recreate means to a pair: it is kept
// (a claim attached to one pod at a time needs it), and a rollout is an
// orderly stop, for which AMF does not switch over.
func recreateWarning(primary *appsv1.Deployment, standby string, hot bool) string {
	if primary.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		return ""
	}
	during := "with a cold standby its clients wait for the new pod, as without AMF"
	if hot {
		during = "the hot standby " + standby + " serves its clients meanwhile"
	}
	return fmt.Sprintf("%s has strategy Recreate, kept, and %s gets it too: a rollout stops the old pod before the new one starts, which an orderly stop does not make a switchover: %s",
		primary.Name, standby, during)
}

func claimComment(src, standby string) string {
	return "# The own claim of standby " + standby + ", written by amf-agent inject --standby:\n" +
		"# the class, size and access modes of " + src + ". A class that binds on first use\n" +
		"# (WaitForFirstConsumer) provisions it when the standby's pod first starts:\n" +
		"# a cold standby's first switchover waits for that.\n"
}

func joinNames(names []string) string { return strings.Join(names, ", ") }

// marshalClaim writes c as YAML without status and null timestamps.
func marshalClaim(c *corev1.PersistentVolumeClaim) ([]byte, error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(c)
	if err != nil {
		return nil, err
	}
	delete(u, "status")
	if m, _ := u["metadata"].(map[string]any); m != nil && m["creationTimestamp"] == nil {
		delete(m, "creationTimestamp")
	}
	return yaml.Marshal(u)
}
