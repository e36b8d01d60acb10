package experiment

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// waitPodReady waits (watch, not poll) for a pod of Deployment name that is
// Ready and not being deleted, and returns it.
func (e *env) waitPodReady(ctx context.Context, ns, name string, timeout time.Duration) (*corev1.Pod, error) {
	return e.waitPod(ctx, ns, name, corev1.PodReady, timeout)
}

// waitPod waits (watch, not poll) for a pod of Deployment name whose condition
// cond is True and that is not being deleted, and returns it.
func (e *env) waitPod(ctx context.Context, ns, name string, cond corev1.PodConditionType, timeout time.Duration) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lw := e.podsListWatch(ns, labels.SelectorFromSet(labels.Set{"app.kubernetes.io/instance": name}).String())
	var ready *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok || ev.Type == watch.Deleted || p.DeletionTimestamp != nil || !podCondition(p, cond) {
			return false, nil
		}
		ready = p
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no pod of %s/%s with %s within %v: %w", ns, name, cond, timeout, err)
	}
	return ready, nil
}

// podsListWatch lists and watches the pods of ns that match selector (all when
// it is empty).
func (e *env) podsListWatch(ns, selector string) *cache.ListWatch {
	return cache.NewFilteredListWatchFromClient(e.client.CoreV1().RESTClient(), "pods", ns,
		func(o *metav1.ListOptions) { o.LabelSelector = selector })
}

// waitPodsGone waits (watch, not poll) until ns has no pod left.
func (e *env) waitPodsGone(ctx context.Context, ns string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	empty := func(store cache.Store) (bool, error) { return len(store.List()) == 0, nil }
	var store cache.Store
	_, err := watchtools.UntilWithSync(ctx, e.podsListWatch(ns, ""), &corev1.Pod{}, func(s cache.Store) (bool, error) {
		store = s
		return empty(s)
	}, func(watch.Event) (bool, error) { return empty(store) })
	if err != nil {
		return fmt.Errorf("pods of %s still there after %v: %w", ns, timeout, err)
	}
	return nil
}

func podCondition(p *corev1.Pod, cond corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == cond {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// watchDeploymentReady reports, once, the time a Deployment first has a Ready
// replica at its current generation; it ends with ctx.
func (e *env) watchDeploymentReady(ctx context.Context, ns, name string, at func(time.Time)) {
	e.watchDeployment(ctx, ns, name, func(d *appsv1.Deployment) bool {
		return d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas >= 1
	}, at)
}

// watchDeployment reports, once, the time Deployment name is first seen
// with ok true; it ends with ctx.
func (e *env) watchDeployment(ctx context.Context, ns, name string, ok func(*appsv1.Deployment) bool, at func(time.Time)) {
	lw := cache.NewListWatchFromClient(e.client.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", name))
	_, _ = watchtools.UntilWithSync(ctx, lw, &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, isDeployment := ev.Object.(*appsv1.Deployment)
		if !isDeployment || !ok(d) {
			return false, nil
		}
		at(time.Now())
		return true, nil
	})
}

// sampleMemory reads a container's memory usage (cgroup v1) as a percentage of
// its limit every second until ctx ends or the cgroup goes.
func sampleMemory(ctx context.Context, cgroup string, add func(time.Time, float64)) {
	dir := filepath.Join("/sys/fs/cgroup/memory", cgroup)
	read := func(f string) (float64, error) {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return 0, err
		}
		return strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	}
	limit, err := read("memory.limit_in_bytes")
	if err != nil || limit <= 0 {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		usage, err := read("memory.usage_in_bytes")
		if err != nil {
			return
		}
		add(time.Now(), 100*usage/limit)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleScore reads the sidecar's /status (its latest anomaly score) every
// second until ctx ends: the agent hears only health changes and anomalous
// samples, the timeline wants the healthy baseline too. It also passes on
// the model the sidecar says it runs (source, sha256, any fallback).
func sampleScore(ctx context.Context, hc *http.Client, url string, add func(time.Time, float64), model func(string)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil); err == nil {
			if resp, err := hc.Do(req); err == nil {
				var st struct {
					Score *float64 `json:"score"`
					Model string   `json:"model"`
				}
				if json.NewDecoder(resp.Body).Decode(&st) == nil {
					if st.Model != "" {
						model(st.Model)
					}
					if st.Score != nil {
						add(time.Now(), *st.Score)
					}
				}
				resp.Body.Close()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
