package nodewatch

import rbacv1 "k8s.io/api/rbac/v1"

// Rules returns the exact RBAC rules node mode needs, beside the agent's
// authentication and actuation rules, for a ClusterRole
// (../manifests/overlays/node-mode/clusterrole-node-mode.yaml; a test keeps
// the two equal).
//
//   - pods list, watch: the pods of the agent's own node. The agent asks
//     only for those (field selector spec.nodeName=<node>), but RBAC cannot
//     confine a ServiceAccount to a field selector: the right reads every
//     pod of the cluster (specs, including environment values written into
//     them; not Secrets). That is the price of node mode, the same right
//     every node-level agent (log shippers, CNI, service meshes' node
//     proxies) holds.
//   - deployments list, watch: whether a pod's Deployment opted in
//     (amf.io/mode), and at once when that changes. Watched as metadata
//     only (the API server sends names, annotations and owners, never a
//     pod template), though RBAC grants the whole object.
//   - replicasets get: a pod's ReplicaSet names its Deployment (as the
//     actuator's right).
//   - events.k8s.io events create: the Warning Event on a pod that opts in
//     but cannot be watched (it carries the sidecar too, or its annotations
//     are wrong).
//   - pods delete: a node-mode primary's pod that the agent retires, on its
//     own node, deleted at once (actuate.Config.DeleteRetiredOn): no
//     readiness gate holds its kubelet-restarted broker out of its Services
//     until the ReplicaSet controller deletes it. RBAC cannot confine the
//     verb to a node; the overlay's admission policy
//     amf-agent-own-node-pod-deletes does: the agent's ServiceAccount
//     deletes only pods bound to the node its token was issued on.
//
// Nothing here writes a Deployment or a ReplicaSet.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch", "delete"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"replicasets"}, Verbs: []string{"get"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}
}
