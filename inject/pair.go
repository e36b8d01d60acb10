package inject

// The pair: the policy annotations, the standby derived from its primary,
// and the spread that keeps the two off one node.

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/amf-edge/amf/contract"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

// pairs is what the stream says of its pairs, read before any Deployment
// of it is injected, and the standbys Inject has written since.
type pairs struct {
	byKey     map[string]*appsv1.Deployment // the stream's Deployments as read, by namespace/name
	primaryOf map[string]*appsv1.Deployment // a standby's namespace/name → the primary naming it (amf.io/standby), as read
	written   map[string]bool               // namespace/name of each standby Inject wrote
}

// readPairs reads the pairs of the stream's Deployments.
func readPairs(docs []document) *pairs {
	p := &pairs{byKey: map[string]*appsv1.Deployment{}, primaryOf: map[string]*appsv1.Deployment{}, written: map[string]bool{}}
	for _, d := range docs {
		dep := d.deployment
		if dep == nil {
			continue
		}
		p.byKey[key(dep.Namespace, dep.Name)] = dep.DeepCopy()
		if s := dep.Annotations[contract.AnnStandby]; s != "" {
			p.primaryOf[key(dep.Namespace, s)] = dep.DeepCopy()
		}
	}
	return p
}

// role says whether dep is a standby (amf.io/role=standby, or named by
// another's amf.io/standby), and whether its pair is hot: a standby's by its
// primary's amf.io/redundancy, a primary's by its own.
func (p *pairs) role(dep *appsv1.Deployment) (isStandby, hot bool) {
	primary := p.primaryOf[key(dep.Namespace, dep.Name)]
	isStandby = dep.Annotations[contract.AnnRole] == "standby" || primary != nil
	hot = primary != nil && redundancy(primary) == contract.Hot || !isStandby && redundancy(dep) == contract.Hot
	return isStandby, hot
}

// partner is the other of dep's pair as the stream holds it, or nil. A
// primary's is named by its amf.io/standby, so setPolicy comes first.
func (p *pairs) partner(dep *appsv1.Deployment, isStandby bool) *appsv1.Deployment {
	if !isStandby {
		return p.byKey[key(dep.Namespace, dep.Annotations[contract.AnnStandby])]
	}
	if primary := p.primaryOf[key(dep.Namespace, dep.Name)]; primary != nil {
		return primary
	}
	return p.byKey[key(dep.Namespace, dep.Annotations[contract.AnnPrimary])]
}

// lacksStandby says whether the standby the primary dep names is neither in
// the stream nor written for an earlier primary naming it too.
func (p *pairs) lacksStandby(dep *appsv1.Deployment) bool {
	k := key(dep.Namespace, dep.Annotations[contract.AnnStandby])
	return p.byKey[k] == nil && !p.written[k]
}

func (p *pairs) wrote(s *standby) { p.written[key(s.Namespace, s.Name)] = true }

// pairInStream refuses dep and its partner, the other of its pair in the
// stream (written earlier, or by hand), when they share a writable claim,
// and with Options.Standby makes dep avoid its partner's pods.
func pairInStream(dep, partner *appsv1.Deployment, opts Options) (warnings []string, err error) {
	if err := checkSharedClaim(dep, partner); err != nil {
		return nil, err
	}
	if !opts.Standby || opts.Mode != contract.ModeSidecar {
		return nil, nil
	}
	return spreadPair(dep, partner, opts.Spread)
}

// standby is a standby Deployment Inject writes after its primary, with the
// claims of its own written after it and what it still shares with the
// primary (ConfigMaps, Secrets, claims mounted read-only).
type standby struct {
	*appsv1.Deployment
	claims []ownClaim
	shared []string
}

// newStandby derives primary's standby, gives it claims of its own copied
// from claims (which it adds them to), and keeps each of the two off the
// other's node.
func newStandby(primary *appsv1.Deployment, opts Options, claims map[string]*corev1.PersistentVolumeClaim) (*standby, []string, error) {
	s, err := standbyFor(primary)
	if err != nil {
		return nil, nil, err
	}
	own, shared, warnings, err := standbyClaims(s, primary, claims)
	if err != nil {
		return nil, nil, err
	}
	shared = append(sharedConfig(&s.Spec.Template.Spec), shared...)
	// Each avoids the other's pods; the new standby in either mode, the
	// primary unless its template is to stay as it is (node mode).
	w, err := spreadPair(s, primary, opts.Spread)
	if err == nil && opts.Mode == contract.ModeSidecar {
		var wp []string
		wp, err = spreadPair(primary, s, opts.Spread)
		w = append(w, wp...)
	}
	if err != nil {
		return nil, nil, err
	}
	return &standby{Deployment: s, claims: own, shared: shared}, append(warnings, w...), nil
}

// warnings are what the user must still see to once s is written: what it
// shares with its primary, and what strategy Recreate means to the pair.
func (s *standby) warnings(primary *appsv1.Deployment) []string {
	var ws []string
	if len(s.shared) > 0 {
		ws = append(ws, fmt.Sprintf(
			"standby %s shares %s with %s: where they set MQTT client IDs (a bridge's local_clientid/remote_clientid, a client's ID), give the standby its own before both run at once",
			s.Name, joinNames(s.shared), primary.Name))
	}
	if w := recreateWarning(primary, s.Name, redundancy(primary) == contract.Hot); w != "" {
		ws = append(ws, w)
	}
	return ws
}

// redundancy is d's amf.io/redundancy as written ("" when unset).
func redundancy(d *appsv1.Deployment) contract.Redundancy {
	return contract.Redundancy(d.Annotations[contract.AnnRedundancy])
}

func standbyComment(primary string, r contract.Redundancy, shared []string) string {
	c := "# " + strings.ToUpper(string(r[:1])) + string(r[1:]) + " standby of " + primary + " written by amf-agent inject --standby.\n"
	if len(shared) > 0 {
		c += "# It shares " + joinNames(shared) + " with the primary: give it its own\n" +
			"# MQTT client IDs (bridge local_clientid/remote_clientid) so both can run during a switchover.\n"
	}
	return c
}

// setPolicy sets the policy annotations the user has not set, and checks them.
func setPolicy(d *appsv1.Deployment) error {
	if d.Annotations == nil {
		d.Annotations = map[string]string{}
	}
	if _, ok := d.Annotations[contract.AnnStandby]; !ok {
		d.Annotations[contract.AnnStandby] = d.Name + "-standby"
	}
	if _, ok := d.Annotations[contract.AnnRedundancy]; !ok {
		d.Annotations[contract.AnnRedundancy] = string(contract.Cold)
	}
	if _, _, err := contract.ParsePolicy(d.Name, d.Annotations); err != nil {
		return fmt.Errorf("policy annotations: %w", err)
	}
	return nil
}

// standbyFor derives the standby Deployment of an injected primary.
func standbyFor(primary *appsv1.Deployment) (*appsv1.Deployment, error) {
	name := primary.Annotations[contract.AnnStandby]
	var replicas int32
	switch r := redundancy(primary); r {
	case contract.Cold:
	case contract.Hot:
		replicas = ptr.Deref(primary.Spec.Replicas, 1)
	default:
		return nil, fmt.Errorf("%s=%s: no standby to write", contract.AnnRedundancy, r)
	}
	if primary.Spec.Selector == nil || len(primary.Spec.Selector.MatchLabels) == 0 {
		return nil, errors.New("the selector has no matchLabels to tell the standby's pods apart")
	}
	s := primary.DeepCopy()
	s.Name = name
	s.OwnerReferences = nil
	s.Status = appsv1.DeploymentStatus{}
	for _, k := range []string{contract.AnnStandby, contract.AnnRedundancy, contract.AnnThreshold, contract.AnnDebounce, contract.AnnReconfirm,
		contract.AnnHold, contract.AnnReadyTimeout, contract.AnnCooldown, contract.AnnAbortDelay, contract.AnnSidecarGrace, contract.AnnRecord, contract.AnnRole, contract.AnnPrimary,
		"kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/revision"} {
		delete(s.Annotations, k)
	}
	s.Annotations[contract.AnnRole] = "standby"
	s.Annotations[contract.AnnPrimary] = primary.Name
	s.Spec.Replicas = ptr.To(replicas)
	labelStandbyPods(s, primary.Name)
	// The primary's own spread term (a primary injected before) is against
	// the standby's pods: not the standby's to keep.
	if err := dropSpread(s, primary); err != nil {
		return nil, err
	}
	return s, nil
}

// labelStandbyPods tells the pods of s, a standby just copied from its
// primary, apart from the primary's, so that the standby's selector matches
// none of the primary's pods: app.kubernetes.io/instance becomes the
// standby's name where the primary's selector has the primary's, else
// LabelStandbyOf is added. The primary's selector is immutable and may match
// the standby's pods; that is harmless, as each ReplicaSet owns its pods and
// a Deployment adopts only orphans.
func labelStandbyPods(s *appsv1.Deployment, primary string) {
	sel := s.Spec.Selector.MatchLabels
	if s.Spec.Template.Labels == nil {
		s.Spec.Template.Labels = map[string]string{}
	}
	if sel[labelInstance] == primary {
		sel[labelInstance] = s.Name
		s.Spec.Template.Labels[labelInstance] = s.Name
		if s.Labels[labelInstance] == primary {
			s.Labels[labelInstance] = s.Name
		}
	} else {
		sel[LabelStandbyOf] = primary
		s.Spec.Template.Labels[LabelStandbyOf] = primary
	}
}

// spreadPair makes d's pods avoid the nodes of other's pods (the other
// Deployment of d's pair), as spread says: the term is added unless there,
// AMF's term of the other kind is removed, and everything else of d's
// affinity is kept. A pair whose pods no label selector tells apart gets a
// warning instead.
func spreadPair(d, other *appsv1.Deployment, spread Spread) (warnings []string, err error) {
	sel, ok, err := podsOf(other, d)
	if err != nil {
		return nil, err
	}
	if !ok {
		return []string{fmt.Sprintf("Deployment %s: the pods of %s carry every label of its own pods, so no anti-affinity can keep the two off one node: give %s's pods a label of their own and inject again",
			d.Name, other.Name, other.Name)}, nil
	}
	spec := &d.Spec.Template.Spec
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.PodAntiAffinity == nil {
		spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	pa := spec.Affinity.PodAntiAffinity
	term := corev1.PodAffinityTerm{LabelSelector: sel, TopologyKey: corev1.LabelHostname}
	same := func(t corev1.PodAffinityTerm) bool { return equality.Semantic.DeepEqual(t, term) }
	sameWeighted := func(w corev1.WeightedPodAffinityTerm) bool { return same(w.PodAffinityTerm) }
	switch spread {
	case SpreadRequired:
		pa.PreferredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.PreferredDuringSchedulingIgnoredDuringExecution, sameWeighted)
		if !slices.ContainsFunc(pa.RequiredDuringSchedulingIgnoredDuringExecution, same) {
			pa.RequiredDuringSchedulingIgnoredDuringExecution = append(pa.RequiredDuringSchedulingIgnoredDuringExecution, term)
		}
	default:
		pa.RequiredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.RequiredDuringSchedulingIgnoredDuringExecution, same)
		if !slices.ContainsFunc(pa.PreferredDuringSchedulingIgnoredDuringExecution, sameWeighted) {
			pa.PreferredDuringSchedulingIgnoredDuringExecution = append(pa.PreferredDuringSchedulingIgnoredDuringExecution,
				corev1.WeightedPodAffinityTerm{Weight: spreadWeight, PodAffinityTerm: term})
		}
	}
	return nil, nil
}

// dropSpread removes from d's template AMF's terms against d's own pods: a
// standby copied from its primary would otherwise avoid itself.
func dropSpread(d, primary *appsv1.Deployment) error {
	sel, ok, err := podsOf(d, primary)
	if err != nil || !ok {
		return err
	}
	a := d.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		return nil
	}
	term := corev1.PodAffinityTerm{LabelSelector: sel, TopologyKey: corev1.LabelHostname}
	pa := a.PodAntiAffinity
	pa.RequiredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.RequiredDuringSchedulingIgnoredDuringExecution,
		func(t corev1.PodAffinityTerm) bool { return equality.Semantic.DeepEqual(t, term) })
	pa.PreferredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(pa.PreferredDuringSchedulingIgnoredDuringExecution,
		func(w corev1.WeightedPodAffinityTerm) bool {
			return equality.Semantic.DeepEqual(w.PodAffinityTerm, term)
		})
	if len(pa.RequiredDuringSchedulingIgnoredDuringExecution) == 0 && len(pa.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution = nil, nil
		a.PodAntiAffinity = nil
		if equality.Semantic.DeepEqual(*a, corev1.Affinity{}) {
			d.Spec.Template.Spec.Affinity = nil
		}
	}
	return nil
}

// podsOf is a label selector of the pods of d and of none of other's: d's
// own selector, and where that matches other's pods too (a standby told
// apart only by amf.io/standby-of), also the absence of a label only
// other's pods carry. ok is false when no such label exists.
func podsOf(d, other *appsv1.Deployment) (sel *metav1.LabelSelector, ok bool, err error) {
	if d.Spec.Selector == nil {
		return nil, false, fmt.Errorf("the Deployment %s has no selector", d.Name)
	}
	sel = d.Spec.Selector.DeepCopy()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, false, fmt.Errorf("the selector of Deployment %s: %w", d.Name, err)
	}
	theirs := other.Spec.Template.Labels
	if !s.Matches(labels.Set(theirs)) {
		return sel, true, nil
	}
	var only []string // label keys of other's pods that d's pods lack
	for k := range theirs {
		if _, mine := d.Spec.Template.Labels[k]; !mine {
			only = append(only, k)
		}
	}
	if len(only) == 0 {
		return nil, false, nil
	}
	slices.Sort(only)
	k := only[0]
	if slices.Contains(only, LabelStandbyOf) {
		k = LabelStandbyOf
	}
	sel.MatchExpressions = append(sel.MatchExpressions, metav1.LabelSelectorRequirement{Key: k, Operator: metav1.LabelSelectorOpDoesNotExist})
	return sel, true, nil
}
