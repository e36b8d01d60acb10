package actuate

import rbacv1 "k8s.io/api/rbac/v1"

// Rules returns the exact RBAC rules the actuator needs, for a ClusterRole
// (or, to confine the agent to some namespaces, a Role in each; see
// ../manifests/base/clusterrole-actuate.yaml). The control-plane test runs the actuator as a
// ServiceAccount bound to exactly these rules.
//
//   - deployments get/watch: read the policy and record, watch the standby's
//     readiness. No list: the agent learns workloads from signals.
//   - deployments patch: the switchover record and the role exchange
//     (annotations), and after a resize in place the broker container's
//     memory in the pod template of a Deployment of the pair while it runs
//     no pod (resize_kube.go: the size survives, nothing rolls); no other
//     field of a spec.
//   - deployments/scale update: scale 0↔1 through the scale subresource (one
//     unconditional update, safe to repeat, so no get).
//   - replicasets get: map a pod to its Deployment.
//   - pods get: owner and readiness gates of a signalling pod; the pod a
//     stateful standby names ready (amf.io/standby-ready), at the retirement.
//   - pods/status patch: the amf.io/healthy condition only.
//   - pods/resize patch: a resize in place of the broker container's
//     memory (resize.go), only for workloads that set amf.io/memory-ceiling.
//     The resize subresource changes nothing but containers' resources.
//   - events.k8s.io events create, patch: evidence of each decision; patch
//     writes the series (count, last time) of a repeated identical Event
//     instead of creating one object per repeat.
//
// Trade-off: Kubernetes RBAC cannot restrict "scale" to Deployments carrying an
// amf.io policy (resourceNames are static), so a ClusterRole lets the agent
// scale any Deployment of the cluster. Binding the same rules as a Role in
// the namespaces that run managed workloads narrows that to those namespaces.
// Nothing here allows deleting pods, reading Secrets, or changing any spec but
// replicas.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "watch", "patch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments/scale"}, Verbs: []string{"update"}},
		{APIGroups: []string{"apps"}, Resources: []string{"replicasets"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/resize"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// RulesWithResume returns Rules plus list on deployments, which
// Config.ResumeOnStart (amf-agent --resume-on-start) needs to find
// interrupted switchovers. Trade-off: list lets the agent read every
// Deployment in scope, where Rules only reads those its pods signal for;
// without it, a switchover stopped after the primary was scaled to 0 but
// before the roles were exchanged is not resumed (see the package doc).
func RulesWithResume() []rbacv1.PolicyRule {
	r := Rules()
	r[0].Verbs = append(r[0].Verbs, "list")
	return r
}
