package testbed

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
)

func TestEdgeConfigBridgesAsThePublicTestbed(t *testing.T) {
	conf := EdgeConfig{Listen: "127.0.0.1:1900", RDS: "127.0.0.1:1901", OBU: "127.0.0.1:1902", ClientID: "edge-a", Bridge: DefaultBridge}.Render()
	for _, want := range []string{
		"listener 1900 127.0.0.1\n",
		"connection obu\naddress 127.0.0.1:1902\ntopic set/# out\ntopic get/# in\ncleansession true\ntry_private false\nkeepalive_interval 30\nrestart_timeout 30\nlocal_clientid edge-a-obu\nremote_clientid edge-a-obu\n",
		"connection rds\naddress 127.0.0.1:1901\ntopic set/# in\ntopic get/# out\n",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("configuration lacks %q:\n%s", want, conf)
		}
	}
}

func TestEdgeAMFObjectsHaveOwnPortsAndClientIDs(t *testing.T) {
	e := Edge{Namespace: "run-1", Node: "amf-lab", RDS: "127.0.0.1:1901", OBU: "127.0.0.1:1902", Bridge: DefaultBridge,
		BrokerPortA: 1910, BrokerPortB: 1911, HealthPortA: 1920, HealthPortB: 1921, AgentAddr: "127.0.0.1:1930"}
	objs, err := e.AMF()
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Deployments) != 2 || len(objs.ConfigMaps) != 2 {
		t.Fatalf("got %d Deployments, %d ConfigMaps; want 2 and 2", len(objs.Deployments), len(objs.ConfigMaps))
	}
	p, s := objs.Deployments[0], objs.Deployments[1]
	if p.Annotations[contract.AnnStandby] != StandbyName || p.Annotations[contract.AnnRedundancy] != "cold" {
		t.Errorf("primary policy = %v", p.Annotations)
	}
	if *s.Spec.Replicas != 0 {
		t.Errorf("cold standby has %d replicas, want 0", *s.Spec.Replicas)
	}
	for i, want := range []struct {
		port, health int32
		config       string
		clientID     string
	}{{1910, 1920, PrimaryName, "edge-a-obu"}, {1911, 1921, StandbyName, "edge-b-obu"}} {
		spec := objs.Deployments[i].Spec.Template.Spec
		if got := spec.Containers[0].Ports[0].ContainerPort; got != want.port {
			t.Errorf("%s: broker port %d, want %d", objs.Deployments[i].Name, got, want.port)
		}
		if got := spec.Volumes[0].ConfigMap.Name; got != want.config {
			t.Errorf("%s: config %s, want %s", objs.Deployments[i].Name, got, want.config)
		}
		sc := spec.InitContainers[0]
		if sc.Name != inject.SidecarName {
			t.Fatalf("%s: first init container %s, want the sidecar", objs.Deployments[i].Name, sc.Name)
		}
		args := strings.Join(sc.Args, " ")
		for _, a := range []string{"--probe-mqtt=tcp://127.0.0.1:" + itoa(want.port), "--http=127.0.0.1:" + itoa(want.health)} {
			if !strings.Contains(args, a) {
				t.Errorf("%s: sidecar args %q lack %q", objs.Deployments[i].Name, args, a)
			}
		}
		if spec.NodeSelector["kubernetes.io/hostname"] != "amf-lab" {
			t.Errorf("%s: node selector %v", objs.Deployments[i].Name, spec.NodeSelector)
		}
		if conf := objs.ConfigMaps[i].Data["mosquitto.conf"]; !strings.Contains(conf, "remote_clientid "+want.clientID+"\n") {
			t.Errorf("%s: configuration lacks client ID %s", objs.ConfigMaps[i].Name, want.clientID)
		}
	}
}

func TestEdgeSidecarsRunTheGivenModel(t *testing.T) {
	for _, tt := range []struct {
		name, model string
		want        []string // the sidecars' --model arguments
	}{
		{"default: the sidecar's own", "", nil},
		{"an embedded name", "leadtime", []string{"--model=leadtime"}},
		{"a path", "/tmp/amf-lab-pods-1/models/m.txt", []string{"--model=/tmp/amf-lab-pods-1/models/m.txt"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := Edge{Namespace: "run-1", RDS: "127.0.0.1:1901", OBU: "127.0.0.1:1902", Bridge: DefaultBridge,
				BrokerPortA: 1910, BrokerPortB: 1911, HealthPortA: 1920, HealthPortB: 1921, SidecarModel: tt.model}
			objs, err := e.AMF()
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range objs.Deployments {
				var got []string
				for _, a := range d.Spec.Template.Spec.InitContainers[0].Args {
					if strings.HasPrefix(a, "--model") {
						got = append(got, a)
					}
				}
				if !slices.Equal(got, tt.want) {
					t.Errorf("%s: sidecar model arguments %q, want %q", d.Name, got, tt.want)
				}
			}
		})
	}
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

func TestEdgeNodeModeObjectsCarryTheAnnotationsAndNoSidecar(t *testing.T) {
	e := Edge{Namespace: "run-1", Node: "amf-lab", RDS: "127.0.0.1:1901", OBU: "127.0.0.1:1902", Bridge: DefaultBridge,
		BrokerPortA: 1910, BrokerPortB: 1911, SidecarModel: "p1"}
	objs, err := e.NodeMode()
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Deployments) != 2 || len(objs.ConfigMaps) != 2 {
		t.Fatalf("got %d Deployments, %d ConfigMaps; want 2 and 2", len(objs.Deployments), len(objs.ConfigMaps))
	}
	for i, want := range []struct {
		port   int32
		config string
	}{{1910, PrimaryName}, {1911, StandbyName}} {
		d := objs.Deployments[i]
		spec := d.Spec.Template.Spec
		if len(spec.InitContainers) != 0 || len(spec.Containers) != 1 || len(spec.ReadinessGates) != 0 {
			t.Errorf("%s: %d init containers, %d containers, readiness gates %v: node mode injects nothing", d.Name, len(spec.InitContainers), len(spec.Containers), spec.ReadinessGates)
		}
		if got := spec.Containers[0].Ports[0].ContainerPort; got != want.port {
			t.Errorf("%s: broker port %d, want %d", d.Name, got, want.port)
		}
		if got := spec.Volumes[0].ConfigMap.Name; got != want.config {
			t.Errorf("%s: config %s, want %s", d.Name, got, want.config)
		}
		for k, v := range map[string]string{contract.AnnMode: "node", contract.AnnModel: "p1", contract.AnnProbe: "mqtt://:" + itoa(want.port)} {
			if d.Annotations[k] != v {
				t.Errorf("%s: %s=%q, want %q", d.Name, k, d.Annotations[k], v)
			}
		}
	}
	e.ModelDir = "/models"
	if _, err := e.NodeMode(); err == nil {
		t.Error("node mode accepted a model file")
	}
}

// TestEdgeStatefulPairKeepsItsStateForTheHandover: with StateDir the edge
// brokers keep their state there, on a volume of their own, and inject
// --state-dir marks both pods for the handover (the sidecar mounts that
// volume too); without it nothing of the kind is written.
func TestEdgeStatefulPairKeepsItsStateForTheHandover(t *testing.T) {
	for _, dir := range []string{"/mosquitto/data", ""} {
		e := Edge{Namespace: "run-1", RDS: "127.0.0.1:1901", OBU: "127.0.0.1:1902", Bridge: DefaultBridge, BrokerPortA: 1883, BrokerPortB: 1883, StateDir: dir}
		objs, err := e.AMF()
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range objs.Deployments {
			spec := d.Spec.Template.Spec
			conf := objs.ConfigMaps[i].Data["mosquitto.conf"]
			mounted := func(c []corev1.VolumeMount) bool {
				return slices.ContainsFunc(c, func(m corev1.VolumeMount) bool { return m.Name == "data" && m.MountPath == dir })
			}
			if dir == "" {
				if !strings.Contains(conf, "persistence false\n") || d.Spec.Template.Annotations[contract.AnnStateDir] != "" || mounted(spec.Containers[0].VolumeMounts) {
					t.Errorf("%s without StateDir: state kept (annotations %v):\n%s", d.Name, d.Spec.Template.Annotations, conf)
				}
				continue
			}
			if !strings.Contains(conf, "persistence true\npersistence_location /mosquitto/data/\n") {
				t.Errorf("%s: configuration keeps no state in %s:\n%s", d.Name, dir, conf)
			}
			if got := d.Spec.Template.Annotations[contract.AnnStateDir]; got != dir {
				t.Errorf("%s: %s = %q, want %q", d.Name, contract.AnnStateDir, got, dir)
			}
			if !mounted(spec.Containers[0].VolumeMounts) || !mounted(spec.InitContainers[0].VolumeMounts) {
				t.Errorf("%s: the broker and the sidecar must both mount the data volume at %s", d.Name, dir)
			}
			if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "data" && v.EmptyDir != nil }) {
				t.Errorf("%s: no emptyDir data volume: %v", d.Name, spec.Volumes)
			}
		}
	}
}
