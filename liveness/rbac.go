package liveness

import rbacv1 "k8s.io/api/rbac/v1"

// Rules returns the exact RBAC rules an agent needs for its heartbeat and
// its guard, for a Role in the namespace of the agents' Leases (the agent's
// own, amf-system): nothing cluster-wide, no Nodes, no other namespace's
// Leases (the kubelets' in kube-node-lease included).
//
//   - leases get, create, update: its own Lease (create once; then one update
//     per period; a get only after a conflict).
//   - leases list, watch: the guard's one watch, selected by LabelNode.
//
// Trade-off: RBAC's resourceNames are static, so an agent may renew any
// agent's Lease, and a compromised agent could keep a lost node looking
// alive (delaying its failover, never causing one). Confining each agent to
// amf-agent-<its node> needs an admission policy on the token's node claim
// (authentication.kubernetes.io/node-name), not RBAC. No delete: a Lease of a
// node that left stays until an operator removes it; a stale Lease is a
// silent node, which a guard only acts on for primaries it guards.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update", "list", "watch"}},
	}
}
