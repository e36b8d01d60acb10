package contract

// The admission path (manifests/overlays/admission): a MutatingAdmissionPolicy
// gives every new pod labelled LabelInject=true the sidecar that inject
// writes into a pod template. A pod cannot see its Deployment, so what
// inject takes from flags or from the Deployment the policy takes from the
// pod's own annotations (its template's): AnnContainer and AnnModel, which
// node mode reads from the Deployment, and the three below.
const (
	// LabelInject opts a pod into the admission policy: "true".
	LabelInject = "amf.io/inject"
	// AnnProbeMQTT is the sidecar's --probe-mqtt (inject --probe-mqtt).
	AnnProbeMQTT = "amf.io/probe-mqtt"
	// AnnStateDir is the folder of the broker's persistence file (inject
	// --state-dir).
	AnnStateDir = "amf.io/state-dir"
	// AnnPauseOnFence "true" lets the sidecar pause its broker when the node
	// agent fences, as inject arranges for a hot pair, whose redundancy is
	// the Deployment's and which a pod cannot read.
	AnnPauseOnFence = "amf.io/pause-on-fence"
)
