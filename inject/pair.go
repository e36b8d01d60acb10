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
	switch r := contract.Redundancy(primary.Annotations[contract.AnnRedundancy]); r {
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
		contract.AnnHold, contract.AnnReadyTimeout, contract.AnnCooldown, contract.AnnAbortDelay, contract.AnnRecord, contract.AnnRole, contract.AnnPrimary,
		"kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/revision"} {
		delete(s.Annotations, k)
	}
	s.Annotations[contract.AnnRole] = "standby"
	s.Annotations[contract.AnnPrimary] = primary.Name
	s.Spec.Replicas = ptr.To(replicas)

	// The standby's selector must not match the primary's pods. The primary's
	// selector is immutable and may match the standby's pods; that is harmless,
	// as each ReplicaSet owns its pods and a Deployment adopts only orphans.
	sel := s.Spec.Selector.MatchLabels
	if s.Spec.Template.Labels == nil {
		s.Spec.Template.Labels = map[string]string{}
	}
	if sel[labelInstance] == primary.Name {
		sel[labelInstance] = name
		s.Spec.Template.Labels[labelInstance] = name
		if s.Labels[labelInstance] == primary.Name {
			s.Labels[labelInstance] = name
		}
	} else {
		sel[LabelStandbyOf] = primary.Name
		s.Spec.Template.Labels[LabelStandbyOf] = primary.Name
	}
	// The primary's own spread term (a primary injected before) is against
	// the standby's pods: not the standby's to keep.
	if err := dropSpread(s, primary); err != nil {
		return nil, err
	}
	return s, nil
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
