package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const plainDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: mosquitto
spec:
  selector:
    matchLabels: {app: mosquitto}
  template:
    metadata:
      labels: {app: mosquitto}
    spec:
      containers: [{name: mosquitto, image: eclipse-mosquitto:2}]
`

func TestInjectCommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "d.yaml")
	if err := os.WriteFile(file, []byte(plainDeployment), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name       string
		args       []string
		stdin      string
		wantOut    []string // substrings of stdout
		wantStderr string
		wantErr    string
	}{
		{name: "reads-standard-input", stdin: plainDeployment,
			wantOut: []string{"name: amf-sidecar", "restartPolicy: Always", "amf.io/standby: mosquitto-standby"}},
		{name: "reads-a-file", args: []string{"-f", file},
			wantOut: []string{"name: amf-sidecar"}},
		{name: "standby-flag-writes-the-standby", args: []string{"--standby"}, stdin: plainDeployment,
			wantOut: []string{"name: mosquitto-standby", "replicas: 0"}},
		{name: "standby-flag-spreads-the-pair-preferred", args: []string{"--standby"}, stdin: plainDeployment,
			wantOut: []string{"podAntiAffinity:\n          preferredDuringSchedulingIgnoredDuringExecution:", "topologyKey: kubernetes.io/hostname", "weight: 100"}},
		{name: "spread-flag-required", args: []string{"--standby", "--spread", "required"}, stdin: plainDeployment,
			wantOut: []string{"podAntiAffinity:\n          requiredDuringSchedulingIgnoredDuringExecution:"}},
		{name: "an-unknown-spread-is-refused", args: []string{"--standby", "--spread", "hard"}, stdin: plainDeployment,
			wantErr: `spread "hard": want preferred or required`},
		{name: "sidecar-image-flag", args: []string{"--sidecar-image", "registry.local/amf-sidecar:dev"}, stdin: plainDeployment,
			wantOut: []string{"image: registry.local/amf-sidecar:dev"}},
		{name: "model-flag-sets-the-sidecars-model", args: []string{"--model", "leadtime"}, stdin: plainDeployment,
			wantOut: []string{"- --model=leadtime"}},
		{name: "model-path-warns-that-it-must-be-mounted", args: []string{"--model", "/models/m.txt"}, stdin: plainDeployment,
			wantOut: []string{"- --model=/models/m.txt"}, wantStderr: "amf-agent inject: warning: the sidecar's model /models/m.txt is a path: mount"},
		{name: "container-flag-names-the-broker", args: []string{"--container", "mosquitto"}, stdin: plainDeployment,
			wantOut: []string{"- --container=mosquitto"}},
		{name: "a-broker-without-limits-is-injected-with-warnings", stdin: plainDeployment,
			wantOut: []string{"name: amf-sidecar"}, wantStderr: "amf-agent inject: warning: Deployment mosquitto: broker container mosquitto has no memory limit"},
		{name: "a-container-that-is-not-there", args: []string{"--container", "broker"}, stdin: plainDeployment,
			wantErr: `no container "broker" to watch: the pod's containers are mosquitto`},
		{name: "mode-node-writes-the-annotation-and-no-sidecar", args: []string{"--mode", "node", "--model", "leadtime"}, stdin: plainDeployment,
			wantOut: []string{"amf.io/mode: node", "amf.io/model: leadtime", "amf.io/standby: mosquitto-standby"}},
		{name: "mode-node-refuses-a-model-path", args: []string{"--mode", "node", "--model", "/models/m.txt"}, stdin: plainDeployment,
			wantErr: "is a path: in node mode"},
		{name: "an-unknown-mode-is-refused", args: []string{"--mode", "daemon"}, stdin: plainDeployment,
			wantErr: `mode "daemon": want sidecar or node`},
		{name: "no-deployment-is-an-error", stdin: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
			wantErr: "no apps/v1 Deployment in the input"},
		{name: "a-model-neither-embedded-nor-a-path-is-refused", args: []string{"--model", "bogus"}, stdin: plainDeployment,
			wantErr: `model "bogus" is not embedded in the sidecar`},
		{name: "a-probe-that-is-not-a-url-is-refused", args: []string{"--probe-mqtt", "not a url"}, stdin: plainDeployment,
			wantErr: `broker URL "not a url"`},
		{name: "state-dir-without-a-volume-there-is-refused", args: []string{"--state-dir", "/mosquitto/data"}, stdin: plainDeployment,
			wantErr: "mounts no volume at /mosquitto/data (--state-dir)"},
		{name: "a-statefulset-alone-is-refused-for-what-it-is", stdin: "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: emqx}\n",
			wantErr: "inject: document 1 (StatefulSet emqx): a StatefulSet is not injected"},
		{name: "refusal-names-the-document", stdin: "apiVersion: apps/v1\nkind: DeploymentList\nitems: []\n",
			wantErr: "inject: document 1 (DeploymentList): a apps/v1 DeploymentList is not injected"},
		{name: "missing-file", args: []string{"-f", filepath.Join(t.TempDir(), "none.yaml")}, wantErr: "no such file"},
		{name: "stray-argument", args: []string{"d.yaml"}, wantErr: "unexpected arguments"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runInject(tt.args, strings.NewReader(tt.stdin), &stdout, &stderr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				if stdout.Len() != 0 {
					t.Errorf("wrote %q despite the error", stdout.String())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q, want %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}
