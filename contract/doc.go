// Package contract is the vocabulary that the sidecar, the agent, the
// Deployment rewriter and the training code agree on: the feature schema (the
// six model inputs, their order and names) and the recovery policy (the
// amf.io annotation keys, the redundancy modes, ParsePolicy, the readiness
// condition, the token audience) and node mode's annotations (amf.io/mode,
// amf.io/model, amf.io/probe; ParseMode, ParseProbe) and the admission
// policy's label and pod annotations (amf.io/inject, admission.go).
//
// It depends on nothing outside the standard library, so any part can name
// the vocabulary without linking a broker or a Kubernetes client (TestNoDeps
// keeps it so). The Python side reads the feature names from
// feature_names.txt, which TestFeatureNamesFile keeps equal to FeatureNames.
package contract
