package inject_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
)

// hotPairWithEverythingToSay is a hot broker that has something to warn of
// at every step (no limits, run as root, a claim of no class bound by
// label, a ConfigMap, strategy Recreate), then a quiet one without a memory
// limit.
const hotPairWithEverythingToSay = `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: b-data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  selector: {matchLabels: {disk: b}}
  resources: {requests: {storage: 1Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: b
  annotations: {amf.io/redundancy: hot}
spec:
  strategy: {type: Recreate}
  selector:
    matchLabels: {app: b}
  template:
    metadata:
      labels: {app: b}
    spec:
      securityContext: {runAsUser: 0}
      containers:
      - name: m
        image: eclipse-mosquitto:2
        envFrom: [{configMapRef: {name: b-config}}]
        volumeMounts: [{name: data, mountPath: /mosquitto/data}]
      volumes:
      - name: data
        persistentVolumeClaim: {claimName: b-data}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      securityContext: {runAsUser: 1000}
      containers:
      - name: m
        image: eclipse-mosquitto:2
        resources: {limits: {cpu: 500m}}
        volumeMounts: [{name: data, mountPath: /mosquitto/data}]
      volumes:
      - name: data
        emptyDir: {}
`

// pairOfLikePods is a pair both in the input whose pods no label tells
// apart.
const pairOfLikePods = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: b
  annotations: {amf.io/standby: b-standby}
spec:
  selector:
    matchLabels: {app: b}
  template:
    metadata:
      labels: {app: b}
    spec:
      containers: [{name: m, image: eclipse-mosquitto:2, resources: {limits: {cpu: 500m, memory: 64Mi}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: b-standby
  annotations: {amf.io/role: standby, amf.io/primary: b}
spec:
  selector:
    matchLabels: {app: b}
  template:
    metadata:
      labels: {app: b}
    spec:
      containers: [{name: m, image: eclipse-mosquitto:2, resources: {limits: {cpu: 500m, memory: 64Mi}}}]
`

// primaryLabelledAsStandby is a primary whose pods carry the label inject
// gives a standby's pods (amf.io/standby-of), so its written standby's
// pods carry every label of the primary's, and the other way round.
const primaryLabelledAsStandby = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: b
  annotations: {amf.io/redundancy: hot}
spec:
  selector: {matchLabels: {app: b}}
  template:
    metadata: {labels: {app: b, amf.io/standby-of: b}}
    spec:
      containers: [{name: m, image: eclipse-mosquitto:2, resources: {limits: {cpu: 500m}}}]
`

// TestResultSaysEachDeploymentInTurnAndItsWarningsInTheOrderOfItsSteps:
// Result names the Deployments injected and the standbys written in stream
// order, and its warnings come Deployment by Deployment, each's in the order
// of its steps (its pod template, its limits, its levers, its standby's
// claims, what the standby shares, its strategy), the model path's last.
func TestResultSaysEachDeploymentInTurnAndItsWarningsInTheOrderOfItsSteps(t *testing.T) {
	for _, tt := range []struct {
		name               string
		in                 string
		opts               inject.Options
		injected, standbys []string
		warnings           []string // one warning containing each, in this order
	}{
		{"sidecar: limits, levers, the standby's claim, what it shares, Recreate, then the next Deployment, the model path last",
			hotPairWithEverythingToSay, inject.Options{Standby: true, StateDir: "/mosquitto/data", Model: "/models/m.txt"},
			[]string{"b", "x"}, []string{"b-standby", "x-standby"}, []string{
				"Deployment b: broker container m has no memory limit",
				"Deployment b: broker container m has no CPU limit",
				"b: its broker's user is root: set a non-root runAsUser on the m container (or the pod), the user its persistence file belongs to",
				"b is hot, but its broker's user is root",
				`claim data-b-standby of standby b-standby has storageClassName "" as b-data has`,
				"claim b-data selects its PersistentVolume by label; claim data-b-standby of standby b-standby is written without that selector",
				"standby b-standby shares ConfigMap b-config with b: where they set MQTT client IDs",
				"b has strategy Recreate, kept, and b-standby gets it too",
				"Deployment x: broker container m has no memory limit",
				"mount the model file and its manifest (/models/m.manifest.json) into the amf-sidecar container of b, x, b-standby, x-standby at that path",
			}},
		{"admission: the levers tried on a copy come before the limits",
			hotPairWithEverythingToSay, inject.Options{Admission: true, Standby: true, StateDir: "/mosquitto/data"},
			[]string{"b", "x"}, []string{"b-standby", "x-standby"}, []string{
				"b: its broker's user is root: set a non-root runAsUser on the m container (or the pod), the user its persistence file belongs to",
				"b is hot, but its broker's user is root",
				"Deployment b: broker container m has no memory limit",
				"Deployment b: broker container m has no CPU limit",
				`claim data-b-standby of standby b-standby has storageClassName "" as b-data has`,
				"claim b-data selects its PersistentVolume by label",
				"standby b-standby shares ConfigMap b-config with b",
				"b has strategy Recreate",
				"Deployment x: broker container m has no memory limit",
			}},
		{"node mode: the limits and the written standby's, no lever",
			hotPairWithEverythingToSay, inject.Options{Mode: contract.ModeNode, Standby: true},
			[]string{"b", "x"}, []string{"b-standby", "x-standby"}, []string{
				"Deployment b: broker container m has no memory limit",
				"Deployment b: broker container m has no CPU limit",
				`claim data-b-standby of standby b-standby has storageClassName "" as b-data has`,
				"claim b-data selects its PersistentVolume by label",
				"standby b-standby shares ConfigMap b-config with b",
				"b has strategy Recreate",
				"Deployment x: broker container m has no memory limit",
			}},
		{"a pair in the input whose pods no label tells apart: each says so of the other",
			pairOfLikePods, inject.Options{Standby: true},
			[]string{"b", "b-standby"}, nil, []string{
				"Deployment b: the pods of b-standby carry every label of its own pods",
				"Deployment b-standby: the pods of b carry every label of its own pods",
			}},
		{"a standby written for a primary whose pods carry its label already: both say so, neither warning lost",
			primaryLabelledAsStandby, inject.Options{Standby: true},
			[]string{"b"}, []string{"b-standby"}, []string{
				"Deployment b: broker container m has no memory limit",
				"b is hot, but its broker's user is not in the pod template",
				"Deployment b-standby: the pods of b carry every label of its own pods",
				"Deployment b: the pods of b-standby carry every label of its own pods",
			}},
		{"a pair in the input without --standby is not spread, so says nothing",
			pairOfLikePods, inject.Options{},
			[]string{"b", "b-standby"}, nil, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, res, err := inject.Inject([]byte(tt.in), tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Injected, tt.injected) || !slices.Equal(res.Standbys, tt.standbys) {
				t.Errorf("injected %q and standbys %q, want %q and %q", res.Injected, res.Standbys, tt.injected, tt.standbys)
			}
			if len(res.Warnings) != len(tt.warnings) {
				t.Fatalf("%d warnings, want %d:\n%s", len(res.Warnings), len(tt.warnings), strings.Join(res.Warnings, "\n"))
			}
			for i, w := range tt.warnings {
				if !strings.Contains(res.Warnings[i], w) {
					t.Errorf("warning %d %q, want one containing %q", i, res.Warnings[i], w)
				}
			}
		})
	}
}
