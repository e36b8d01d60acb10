// Package cluster is the agent's one seam to Kubernetes: every call that
// actuate, nodewatch, liveness and the agent's TokenReview make to the API
// server, named by what they mean (scale, swap the switchover record, renew
// a Lease, review a token) rather than by API verbs. Kube is the real one,
// on a client-go clientset; clusterfake.Cluster is the in-memory one every
// consumer's unit tests use, so that a test of one package exercises the
// same fake as the others, with the API server's semantics that matter
// (NotFound and Conflict as apierrors, resourceVersions, a compare-and-swap
// for the record, watches that resume from a resourceVersion).
//
// # One implementation, small interfaces where they are used
//
// Kube and the fake each carry every method; they are concrete types. Each
// consumer declares the interface of just the calls it makes (actuate.Cluster,
// nodewatch.Cluster, liveness.Cluster, agent.TokenReviewer), as Go's
// interfaces are meant to be: a package asks for what it uses, so its tests
// and its reader see its whole dependency on Kubernetes at one glance, and
// a wrapper such as actuate.DryRun wraps only what the actuator calls. Each
// consumer asserts at compile time that both Kube and the fake satisfy its
// interface, which is what keeps the two in step.
//
// # What stays on client-go
//
// Informers. nodewatch keeps every pod of its node and the metadata of
// every Deployment in client-go shared informers, whose caches, indexers,
// relists and event handlers are the point of using them; they take a
// kubernetes.Interface and a metadata.Interface directly, and nodewatch's
// tests feed them client-go's fake clientset and fake metadata client. Only
// the calls nodewatch makes itself (get a ReplicaSet, create an Event) go
// through this package. The one watch the seam does cover is the guard's
// list+watch of Leases (LeaseListWatch), because it is a single
// cache.ListerWatcher handed to watchtools.UntilWithSync, which the fake can
// serve faithfully; the Deployment watch of the actuator is covered as a
// callback (WatchDeployment). connkill's pod informer is outside the seam for
// the same reason as nodewatch's.
//
// # Errors
//
// Kube returns client-go's errors (apierrors applies) and the fake returns
// the same kinds; ErrRecordMoved from SwapRecord is part of the contract.
package cluster
