package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// TestVolumes writes every supported volume type of a pod and checks files,
// modes and the container's path rewrites, and refreshes the projected
// token at 80 % of its lifetime on a fake clock.
func TestVolumes(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	cs := fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "conf", Namespace: "ns"}, Data: map[string]string{"mosquitto.conf": "listener 1883\n", "other": "x"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "ns"}, Data: map[string][]byte{"pw": []byte("s3cret")}},
	)
	issued := make(chan *authenticationv1.TokenRequest, 10)
	fail := make(chan error, 1)
	count := 0 // reactors run one at a time
	cs.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		select {
		case err := <-fail:
			return true, nil, err
		default:
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		count++
		tr.Status.Token = fmt.Sprintf("token-%d", count)
		tr.Status.ExpirationTimestamp = metav1.NewTime(clk.Now().Add(time.Duration(*tr.Spec.ExpirationSeconds) * time.Second))
		issued <- tr
		return true, tr, nil
	})
	n := &Node{cfg: Config{Client: cs, StateDir: t.TempDir(), HostIP: "127.0.0.1"}, clock: clk, log: slog.New(slog.DiscardHandler)}
	api := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "broker", Namespace: "ns", UID: "u-1", Labels: map[string]string{"app": "b"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "amf",
			SecurityContext:    &corev1.PodSecurityContext{FSGroup: ptr.To[int64](1883)},
			Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{
				{Name: "config", MountPath: "/mosquitto/config"},
				{Name: "token", MountPath: "/var/run/secrets/amf"},
				{Name: "host", MountPath: "/host/etc", SubPath: "hostname"},
			}}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"},
					Items: []corev1.KeyToPath{{Key: "mosquitto.conf", Path: "mosquitto.conf"}}}}},
				{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec", DefaultMode: ptr.To[int32](0o400)}}},
				{Name: "optional", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc"}}},
				{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}},
				{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "amf-agent", ExpirationSeconds: ptr.To[int64](3600), Path: "token"}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}, Items: []corev1.KeyToPath{{Key: "other", Path: "sub/other"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
				}}}},
			},
		},
	}
	p := newPod(n, api)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	vols, err := p.prepareVolumes(ctx, api)
	if err != nil {
		t.Fatal(err)
	}
	p.volumes = vols
	vol := func(name string) string { return filepath.Join(p.dir, "volumes", name) }
	for _, f := range []struct {
		path, content string
		mode          os.FileMode
	}{
		{filepath.Join(vol("config"), "mosquitto.conf"), "listener 1883\n", 0o644},
		{filepath.Join(vol("secret"), "pw"), "s3cret", 0o400},
		{filepath.Join(vol("info"), "labels"), `app="b"`, 0o644},
		{filepath.Join(vol("token"), "token"), "token-1", 0o644},
		{filepath.Join(vol("token"), "sub", "other"), "x", 0o644},
		{filepath.Join(vol("token"), "namespace"), "ns", 0o644},
	} {
		b, err := os.ReadFile(f.path)
		if err != nil || string(b) != f.content {
			t.Errorf("%s: %q %v, want %q", f.path, b, err, f.content)
			continue
		}
		fi, _ := os.Stat(f.path)
		if fi.Mode().Perm() != f.mode {
			t.Errorf("%s: mode %v, want %v", f.path, fi.Mode().Perm(), f.mode)
		}
		if st, ok := fi.Sys().(interface{ Gid() int }); ok && st.Gid() != 1883 {
			t.Errorf("%s: not group fsGroup", f.path)
		}
	}
	if fi, err := os.Stat(vol("scratch")); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("emptyDir %v %v", fi, err)
	}
	if vols["host"] != "/etc" {
		t.Errorf("hostPath dir %q", vols["host"])
	}
	tr := <-issued
	if got := tr.Spec; len(got.Audiences) != 1 || got.Audiences[0] != "amf-agent" || *got.ExpirationSeconds != 3600 ||
		got.BoundObjectRef == nil || got.BoundObjectRef.Kind != "Pod" || got.BoundObjectRef.UID != "u-1" || got.BoundObjectRef.Name != "broker" {
		t.Errorf("token request %+v", got)
	}
	rs, err := p.rewrites(&api.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"/mosquitto/config/mosquitto.conf":        filepath.Join(vol("config"), "mosquitto.conf"),
		"--token-file=/var/run/secrets/amf/token": "--token-file=" + filepath.Join(vol("token"), "token"),
		"/host/etc": "/etc/hostname",
	} {
		if got := rewritePaths(in, rs); got != want {
			t.Errorf("rewrite %q = %q, want %q", in, got, want)
		}
	}
	if _, err := p.rewrites(&corev1.Container{VolumeMounts: []corev1.VolumeMount{{Name: "nope", MountPath: "/x"}}}); err == nil {
		t.Error("a mount of a missing volume was accepted")
	}

	// Refresh: at 80 % of the hour (48 min), not before; a failure is
	// retried 10 s later.
	done := make(chan struct{})
	go func() { p.refreshTokens(ctx); close(done) }()
	tokenFile := filepath.Join(vol("token"), "token")
	waitWaiters(t, clk)
	clk.Step(48*time.Minute - time.Second)
	if b, _ := os.ReadFile(tokenFile); string(b) != "token-1" || len(issued) != 0 {
		t.Fatalf("refreshed before 80 %%: %q", b)
	}
	fail <- errors.New("API down")
	clk.Step(time.Second) // 48 min: the refresh fails
	waitWaiters(t, clk)
	clk.Step(10 * time.Second)
	<-issued
	waitWaiters(t, clk) // the refresher sleeps again: the file is written
	if b, _ := os.ReadFile(tokenFile); string(b) != "token-2" {
		t.Errorf("after the refresh: %q", b)
	}
	cancel()
	<-done

	// Errors: an unsupported volume, a missing ConfigMap, a missing key.
	for _, v := range []corev1.Volume{
		{Name: "pvc", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}},
		{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}}},
		{Name: "key", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}, Items: []corev1.KeyToPath{{Key: "nokey", Path: "f"}}}}},
		{Name: "hp", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/hostname", Type: ptr.To(corev1.HostPathDirectory)}}},
	} {
		bad := api.DeepCopy()
		bad.Spec.Volumes = []corev1.Volume{v}
		if _, err := p.prepareVolumes(context.Background(), bad); err == nil {
			t.Errorf("volume %s: no error", v.Name)
		}
	}
}
