package node

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// qosClass is the pod's QoS class: the one the API server recorded in the
// status, else computed as Kubernetes does (pkg/apis/core/v1/helper/qos).
func qosClass(pod *corev1.Pod) corev1.PodQOSClass {
	if pod.Status.QOSClass != "" {
		return pod.Status.QOSClass
	}
	return computeQOS(pod)
}

func computeQOS(pod *corev1.Pod) corev1.PodQOSClass {
	requests, limits := corev1.ResourceList{}, corev1.ResourceList{}
	guaranteed := true
	supported := func(n corev1.ResourceName) bool { return n == corev1.ResourceCPU || n == corev1.ResourceMemory }
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for n, q := range c.Resources.Requests {
				if supported(n) && q.Sign() > 0 {
					add(requests, n, q)
				}
			}
			found := 0
			for n, q := range c.Resources.Limits {
				if supported(n) && q.Sign() > 0 {
					add(limits, n, q)
					found++
				}
			}
			if found < 2 {
				guaranteed = false
			}
		}
	}
	if len(requests) == 0 && len(limits) == 0 {
		return corev1.PodQOSBestEffort
	}
	if guaranteed {
		for n, req := range requests {
			if lim, ok := limits[n]; !ok || lim.Cmp(req) != 0 {
				guaranteed = false
				break
			}
		}
	}
	if guaranteed && len(requests) == len(limits) {
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

func add(l corev1.ResourceList, n corev1.ResourceName, q resource.Quantity) {
	if cur, ok := l[n]; ok {
		cur.Add(q)
		l[n] = cur
		return
	}
	l[n] = q.DeepCopy()
}

// podCgroupPath is the pod's cgroup in the kubelet's cgroupfs layout.
func podCgroupPath(qos corev1.PodQOSClass, uid string) string {
	switch qos {
	case corev1.PodQOSGuaranteed:
		return "/kubepods/pod" + uid
	case corev1.PodQOSBestEffort:
		return "/kubepods/besteffort/pod" + uid
	}
	return "/kubepods/burstable/pod" + uid
}

// limits are the cgroup v1 values of a container or pod.
type limits struct {
	memory    int64  // memory.limit_in_bytes; 0: none
	cpuShares uint64 // cpu.shares
	cpuQuota  int64  // cpu.cfs_quota_us; 0: none
}

const cpuPeriod = 100000 // cpu.cfs_period_us, the kubelet's

// cpuShares and cpuQuota are the kubelet's MilliCPUToShares and MilliCPUToQuota.
func cpuShares(milli int64) uint64 {
	if milli <= 0 {
		return 2
	}
	return uint64(min(max(milli*1024/1000, 2), 262144))
}

func cpuQuota(milli int64) int64 {
	if milli <= 0 {
		return 0
	}
	return max(milli*cpuPeriod/1000, 1000)
}

// containerLimits: memory.limit_in_bytes from limits.memory, cpu.shares from
// requests.cpu, the CFS quota from limits.cpu.
func containerLimits(c *corev1.Container) limits {
	l := limits{cpuShares: cpuShares(c.Resources.Requests.Cpu().MilliValue())}
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		l.memory = q.Value()
	}
	if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		l.cpuQuota = cpuQuota(q.MilliValue())
	}
	return l
}

// podLimits are the pod cgroup's values as the kubelet sets them: the sum over
// the containers and native sidecars (or the largest regular init container if
// that is more), a memory limit and CPU quota only when every container has one.
func podLimits(pod *corev1.Pod) limits {
	var reqCPU, limCPU, limMem int64
	allMem, allCPU := true, true
	sum := func(c *corev1.Container) {
		reqCPU += c.Resources.Requests.Cpu().MilliValue()
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			limMem += q.Value()
		} else {
			allMem = false
		}
		if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			limCPU += q.MilliValue()
		} else {
			allCPU = false
		}
	}
	var initReq, initCPU, initMem int64
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if isSidecar(c) {
			sum(c)
			continue
		}
		initReq = max(initReq, c.Resources.Requests.Cpu().MilliValue())
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			initMem = max(initMem, q.Value())
		} else {
			allMem = false
		}
		if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
			initCPU = max(initCPU, q.MilliValue())
		} else {
			allCPU = false
		}
	}
	for i := range pod.Spec.Containers {
		sum(&pod.Spec.Containers[i])
	}
	l := limits{cpuShares: cpuShares(max(reqCPU, initReq))}
	if allMem {
		l.memory = max(limMem, initMem)
	}
	if allCPU {
		l.cpuQuota = cpuQuota(max(limCPU, initCPU))
	}
	return l
}

// isSidecar reports a native sidecar: an init container with restartPolicy Always.
func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}
