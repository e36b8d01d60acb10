package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func res(cpuReq, memReq, cpuLim, memLim string) corev1.ResourceRequirements {
	r := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	set := func(l corev1.ResourceList, n corev1.ResourceName, v string) {
		if v != "" {
			l[n] = resource.MustParse(v)
		}
	}
	set(r.Requests, corev1.ResourceCPU, cpuReq)
	set(r.Requests, corev1.ResourceMemory, memReq)
	set(r.Limits, corev1.ResourceCPU, cpuLim)
	set(r.Limits, corev1.ResourceMemory, memLim)
	return r
}

func TestQOS(t *testing.T) {
	sidecar := corev1.Container{Name: "s", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}
	for _, tc := range []struct {
		name       string
		init, ctrs []corev1.ResourceRequirements
		want       corev1.PodQOSClass
		path       string
	}{
		{"nothing", nil, []corev1.ResourceRequirements{{}}, corev1.PodQOSBestEffort, "/kubepods/besteffort/podU"},
		{"limits equal requests", nil, []corev1.ResourceRequirements{res("500m", "100Mi", "500m", "100Mi")}, corev1.PodQOSGuaranteed, "/kubepods/podU"},
		{"the paper's broker", nil, []corev1.ResourceRequirements{res("250m", "50Mi", "500m", "100Mi")}, corev1.PodQOSBurstable, "/kubepods/burstable/podU"},
		{"memory limit only", nil, []corev1.ResourceRequirements{res("", "", "", "100Mi")}, corev1.PodQOSBurstable, "/kubepods/burstable/podU"},
		{"one guaranteed, one empty", nil, []corev1.ResourceRequirements{res("1", "1Gi", "1", "1Gi"), {}}, corev1.PodQOSBurstable, "/kubepods/burstable/podU"},
		{"init container counts", []corev1.ResourceRequirements{res("100m", "", "", "")}, []corev1.ResourceRequirements{{}}, corev1.PodQOSBurstable, "/kubepods/burstable/podU"},
		{"both guaranteed", []corev1.ResourceRequirements{res("100m", "16Mi", "100m", "16Mi")}, []corev1.ResourceRequirements{res("1", "1Gi", "1", "1Gi")}, corev1.PodQOSGuaranteed, "/kubepods/podU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{}
			for _, r := range tc.init {
				c := sidecar
				c.Resources = r
				pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
			}
			for _, r := range tc.ctrs {
				pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "c", Resources: r})
			}
			if got := computeQOS(pod); got != tc.want {
				t.Errorf("QoS %s, want %s", got, tc.want)
			}
			if got := podCgroupPath(qosClass(pod), "U"); got != tc.path {
				t.Errorf("path %s, want %s", got, tc.path)
			}
			pod.Status.QOSClass = corev1.PodQOSGuaranteed
			if qosClass(pod) != corev1.PodQOSGuaranteed {
				t.Error("the API's QoS class was not used")
			}
		})
	}
}

func TestLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    corev1.ResourceRequirements
		want limits
	}{
		{"the paper's broker", res("250m", "50Mi", "500m", "100Mi"), limits{memory: 100 << 20, cpuShares: 256, cpuQuota: 50000}},
		{"the sidecar", res("10m", "16Mi", "100m", "48Mi"), limits{memory: 48 << 20, cpuShares: 10, cpuQuota: 10000}},
		{"best effort", corev1.ResourceRequirements{}, limits{cpuShares: 2}},
		{"tiny quota", res("1m", "", "1m", ""), limits{cpuShares: 2, cpuQuota: 1000}},
		{"two cpus", res("2", "", "2", ""), limits{cpuShares: 2048, cpuQuota: 200000}},
	} {
		if got := containerLimits(&corev1.Container{Resources: tc.r}); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "s", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: res("10m", "16Mi", "100m", "48Mi")}},
		Containers:     []corev1.Container{{Name: "b", Resources: res("250m", "50Mi", "500m", "100Mi")}},
	}}
	if got, want := podLimits(pod), (limits{memory: 148 << 20, cpuShares: 266, cpuQuota: 60000}); got != want {
		t.Errorf("pod: %+v, want %+v", got, want)
	}
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "free"})
	if got, want := podLimits(pod), (limits{cpuShares: 266}); got != want {
		t.Errorf("pod with an unlimited container: %+v, want %+v", got, want)
	}
}
