package experiment

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/testbed"
)

// The amf mode runs its pair as a stateful pair (DESIGN.md, "Broker
// state"): Mosquitto with persistence on, its data on a volume at
// brokerstate.DataDir, injected with --state-dir, so that a switchover
// carries what the broker holds. Before the fault real clients put
// statePlan into the primary; after the run the new primary is checked
// for it. The other modes keep the stateless pair: node mode has no
// sidecar to save and load a state, the resize modes compare with the
// stateless runs before them, and observe and healthy never switch over.

// statePlan is what the primary holds before the fault: modest, so that
// seeding takes seconds and the state a few tens of kB, and of each kind
// brokerstate checks (retained, 3.1.1 and MQTT 5 sessions, QoS 1 queues).
var statePlan = brokerstate.Plan{Retained: 200, Sessions: 2, V5Sessions: 1, Queued: 5, Prefix: "amf-experiment"}

// stateful reports whether mode m runs a stateful pair.
func (m Mode) stateful() bool { return m == AMF }

// StateCheck is what the new primary held of the state seeded into the
// old one before the fault (brokerstate.Check), against what was seeded.
// Its fields sit beside the run's others in results.json.
type StateCheck struct {
	StateRetained     int `json:"state_retained"` // retained messages seeded
	StateRetainedLost int `json:"state_retained_lost"`
	// StateSessions are the persistent sessions seeded (MQTT 3.1.1 and 5);
	// a session is lost when its client reads Session Present 0, finds its
	// subscription gone or (MQTT 5) gets none of its queue.
	StateSessions        int      `json:"state_sessions"`
	StateSessionsLost    int      `json:"state_sessions_lost"`
	StateSessionsLostIDs []string `json:"state_sessions_lost_ids,omitempty"`
	StateQoS1            int      `json:"state_qos1"` // QoS 1 messages queued for the sessions
	StateQoS1Lost        int      `json:"state_qos1_lost"`
	StateDuplicates      int      `json:"state_duplicates"` // queued messages delivered more than once
}

func stateCheckOf(p brokerstate.Plan, r brokerstate.Result) *StateCheck {
	ids := p.SessionIDs()
	return &StateCheck{
		StateRetained: p.Retained, StateRetainedLost: r.RetainedLost,
		StateSessions: len(ids), StateSessionsLost: len(r.SessionsLost), StateSessionsLostIDs: r.SessionsLost,
		StateQoS1: len(ids) * p.Queued, StateQoS1Lost: r.QueuedLost, StateDuplicates: r.Duplicates,
	}
}

// lossless says whether the new primary held everything, none twice.
func (c *StateCheck) lossless() bool {
	return c.StateRetainedLost == 0 && c.StateSessionsLost == 0 && c.StateQoS1Lost == 0 && c.StateDuplicates == 0
}

// text is c in words. Not String: RunResult embeds a *StateCheck, and would
// take the method, nil or not, for its own.
func (c *StateCheck) text() string {
	return fmt.Sprintf("retained lost %d of %d, sessions lost %d of %d, QoS 1 lost %d of %d, duplicates %d",
		c.StateRetainedLost, c.StateRetained, c.StateSessionsLost, c.StateSessions, c.StateQoS1Lost, c.StateQoS1, c.StateDuplicates)
}

// planText says what a stateful run seeds.
func planText(p brokerstate.Plan) string {
	return fmt.Sprintf("%d retained messages, %d MQTT 3.1.1 and %d MQTT 5 persistent sessions, %d QoS 1 messages queued for each while it is away",
		p.Retained, p.Sessions, p.V5Sessions, p.Queued)
}

// statefulEdge is the run's pair as a stateful pair: the broker Deployment
// a user writes (ed.Reactive's) with its data on a volume, as
// `amf-agent inject --standby --state-dir` writes it of that, and each
// broker's configuration (ed.AMF's: its bridges with client IDs of its
// own) with persistence on there. What inject writes is then fitted to the
// run as testbed.Edge fits a stateless pair: the standby reads its own
// configuration, and the sidecars mount the model folder when there is one.
// (Edge's other fittings are for runs with ports of their own, which the
// experiment's pods, each in a network of its own, do not need.)
func statefulEdge(ed testbed.Edge) (testbed.Objects, error) {
	stateless, err := ed.AMF()
	if err != nil {
		return testbed.Objects{}, err
	}
	plain, err := ed.Reactive()
	if err != nil {
		return testbed.Objects{}, err
	}
	d := plain.Deployments[0]
	d.Annotations = map[string]string{contract.AnnStandby: testbed.StandbyName, contract.AnnRedundancy: string(contract.Cold)}
	for k, v := range ed.Policy {
		d.Annotations[k] = v
	}
	primary, standby, err := brokerstate.StatefulPair(d, inject.Options{SidecarImage: ed.SidecarImage, Model: ed.SidecarModel})
	if err != nil {
		return testbed.Objects{}, err
	}
	if primary.Name != testbed.PrimaryName || standby.Name != testbed.StandbyName {
		return testbed.Objects{}, fmt.Errorf("inject wrote %s and %s, want %s and %s", primary.Name, standby.Name, testbed.PrimaryName, testbed.StandbyName)
	}
	if err := configFrom(standby, testbed.StandbyName); err != nil {
		return testbed.Objects{}, err
	}
	for _, dep := range []*appsv1.Deployment{primary, standby} {
		if err := mountModels(dep, ed.ModelDir); err != nil {
			return testbed.Objects{}, err
		}
	}
	for _, cm := range stateless.ConfigMaps {
		conf, err := brokerstate.Persistent(cm.Data["mosquitto.conf"])
		if err != nil {
			return testbed.Objects{}, fmt.Errorf("ConfigMap %s: %w", cm.Name, err)
		}
		cm.Data["mosquitto.conf"] = conf
	}
	return testbed.Objects{ConfigMaps: stateless.ConfigMaps, Deployments: []*appsv1.Deployment{primary, standby}}, nil
}

// configFrom has d's broker read its configuration from ConfigMap name.
func configFrom(d *appsv1.Deployment, name string) error {
	for i := range d.Spec.Template.Spec.Volumes {
		if v := &d.Spec.Template.Spec.Volumes[i]; v.Name == "config" && v.ConfigMap != nil {
			v.ConfigMap.Name = name
			return nil
		}
	}
	return fmt.Errorf("%s has no config volume", d.Name)
}

// mountModels mounts host folder dir (none: nothing to do) read-only into
// d's sidecar at testbed.ModelMount, where its --model names a file.
func mountModels(d *appsv1.Deployment, dir string) error {
	if dir == "" {
		return nil
	}
	spec := &d.Spec.Template.Spec
	for i := range spec.InitContainers {
		if c := &spec.InitContainers[i]; c.Name == inject.SidecarName {
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "amf-models", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectory)},
			}})
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "amf-models", MountPath: testbed.ModelMount, ReadOnly: true})
			return nil
		}
	}
	return fmt.Errorf("%s has no sidecar", d.Name)
}

// seedState puts statePlan into the broker of pod, the primary, with real
// clients, and returns the plan.
func (e *env) seedState(ctx context.Context, pod *corev1.Pod) (brokerstate.Plan, error) {
	p := statePlan
	sub, err := brokerstate.MosquittoSub()
	if err != nil {
		return p, fmt.Errorf("the MQTT 5 session of the state: %w", err)
	}
	p.MosquittoSub = sub
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := brokerstate.Seed(ctx, brokerstate.Addr(pod), p); err != nil {
		return p, fmt.Errorf("seed the primary's state: %w", err)
	}
	return p, nil
}

// checkState checks what the new primary (the standby Deployment's pod,
// which serves once it runs on the state) holds of plan.
func (e *env) checkState(ctx context.Context, ns string, plan brokerstate.Plan) (*StateCheck, error) {
	pod, err := e.waitPodReady(ctx, ns, testbed.StandbyName, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("the new primary: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r, err := brokerstate.Check(ctx, brokerstate.Addr(pod), plan)
	if err != nil {
		return nil, fmt.Errorf("check the new primary's state: %w", err)
	}
	return stateCheckOf(plan, r), nil
}

// standbyMarked reports whether the agent of the standby's node names its
// pod ready for a state (contract.AnnStandbyReady): a stateful pair's
// standby is held out of its Services, so it has no Ready replica to show
// until it runs on the state, and this is what the Gate takes for its
// readiness instead.
func standbyMarked(d *appsv1.Deployment) bool { return d.Annotations[contract.AnnStandbyReady] != "" }
