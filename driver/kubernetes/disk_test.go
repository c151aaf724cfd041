package kubernetes

import (
	"strings"
	"testing"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/sandboxwich/sandboxwich/lease"
)

// writableDisk sums the size limits of the emptyDirs the cell container
// mounts writable, failing on one without a limit or not memory-backed.
func writableDisk(t *testing.T, pod *corev1.Pod) int64 {
	t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	var sum int64
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		v := vols[m.Name]
		if m.ReadOnly || v.EmptyDir == nil {
			continue
		}
		if v.EmptyDir.SizeLimit == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
			t.Errorf("emptyDir %s at %s: %+v, want memory-backed with a size limit", m.Name, m.MountPath, v.EmptyDir)
			continue
		}
		sum += v.EmptyDir.SizeLimit.Value()
	}
	return sum
}

// TestCellDiskPod: the Pod's writable storage (memory-backed emptyDirs
// and the ephemeral-storage limit) is cell_disk_bytes, half the memory by
// default, with and without the agent; Inspect refuses an admitted Pod
// whose storage is unbounded or larger.
func TestCellDiskPod(t *testing.T) {
	p := fakeProvider(t, fake.NewClientset())
	if p.cfg.CellDiskBytes != 256<<20 {
		t.Errorf("default CellDiskBytes = %d, want half of 512Mi", p.cfg.CellDiskBytes)
	}
	id := uuid.Must(uuid.NewV7())
	pod := p.podSpec(id, lease.GVisorLowerRisk, "gvisor", fakeImage)
	if got := writableDisk(t, pod); got != p.cfg.CellDiskBytes {
		t.Errorf("writable emptyDirs hold %d bytes, want %d", got, p.cfg.CellDiskBytes)
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		if q := c.Resources.Limits[corev1.ResourceEphemeralStorage]; q.Value() != p.cfg.CellDiskBytes {
			t.Errorf("container %s ephemeral-storage limit %s, want %d", c.Name, q.String(), p.cfg.CellDiskBytes)
		}
	}

	withAgent, err := New(Config{Client: fake.NewClientset(), Namespace: "cells", Pool: "p", Installation: fakeInstallation,
		RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor"}, Image: fakeImage, AgentImage: fakeImage,
		Memory: "1Gi", CellDiskBytes: 300 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if got := writableDisk(t, withAgent.podSpec(id, lease.GVisorLowerRisk, "gvisor", fakeImage)); got != 300<<20 {
		t.Errorf("with the agent, writable emptyDirs hold %d bytes, want 300 MiB together", got)
	}

	for name, mutate := range map[string]func(*corev1.Pod){
		"no ephemeral-storage limit": func(pod *corev1.Pod) {
			delete(pod.Spec.Containers[0].Resources.Limits, corev1.ResourceEphemeralStorage)
		},
		"larger ephemeral-storage": func(pod *corev1.Pod) {
			pod.Spec.Containers[0].Resources.Limits[corev1.ResourceEphemeralStorage] = resource.MustParse("10Gi")
		},
		"unbounded emptyDir": func(pod *corev1.Pod) { pod.Spec.Volumes[0].EmptyDir.SizeLimit = nil },
		"larger emptyDir":    func(pod *corev1.Pod) { pod.Spec.Volumes[0].EmptyDir.SizeLimit = ptr(resource.MustParse("1Gi")) },
		"another emptyDir": func(pod *corev1.Pod) {
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "more",
				VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "more", MountPath: "/more"})
		},
	} {
		pod := readyPod(p, id, "uid-1")
		if o := p.observe(pod, ""); o.RuntimeClass != lease.GVisorLowerRisk {
			t.Fatalf("unmodified pod: %+v", o)
		}
		mutate(pod)
		if o := p.observe(pod, ""); o.RuntimeClass != "" || !strings.Contains(o.Detail, "cell_disk_bytes") && !strings.Contains(o.Detail, "size limit") {
			t.Errorf("%s: runtime class %q (%s), want none", name, o.RuntimeClass, o.Detail)
		}
	}
}

// TestCellDiskConfig: a cell_disk_bytes not below the memory, or
// differing from tmp_size (its older name), stops New naming the key;
// tmp_size alone sets it; the setting must be a positive number.
func TestCellDiskConfig(t *testing.T) {
	good := func() Config {
		return Config{Client: fake.NewClientset(), Namespace: "cells", Pool: "p", Installation: fakeInstallation,
			RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor"}, Image: fakeImage}
	}
	for name, edit := range map[string]func(*Config){
		"equal to memory":       func(c *Config) { c.CellDiskBytes = 512 << 20 },
		"above memory":          func(c *Config) { c.Memory, c.CellDiskBytes = "256Mi", 300<<20 },
		"tmp_size above memory": func(c *Config) { c.TmpSize = "1Gi" },
		"differs from tmp_size": func(c *Config) { c.TmpSize, c.CellDiskBytes = "128Mi", 100<<20 },
		"below the minimum":     func(c *Config) { c.CellDiskBytes = 1000 },
	} {
		c := good()
		edit(&c)
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "cell_disk_bytes") {
			t.Errorf("%s: New = %v, want an error naming cell_disk_bytes", name, err)
		}
	}
	c := good()
	c.TmpSize = "128Mi"
	p, err := New(c)
	if err != nil || p.cfg.CellDiskBytes != 128<<20 {
		t.Errorf("tmp_size 128Mi: %v, CellDiskBytes %d", err, p.cfg.CellDiskBytes)
	}
	kc := t.TempDir() + "/kubeconfig"
	if err := writeKubeconfig(kc); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"kubeconfig": kc, "namespace": "cells", "image": fakeImage, "runtime_class_gvisor_lower_risk": "gvisor"}
	for _, bad := range []string{"0", "-5", "1Gi"} {
		s := map[string]string{"cell_disk_bytes": bad}
		for k, v := range base {
			s[k] = v
		}
		if _, err := ConfigFromSettings("p", s); err == nil || !strings.Contains(err.Error(), "cell_disk_bytes") {
			t.Errorf("setting cell_disk_bytes %q: %v", bad, err)
		}
	}
	base["cell_disk_bytes"] = "104857600"
	if cfg, err := ConfigFromSettings("p", base); err != nil || cfg.CellDiskBytes != 100<<20 {
		t.Errorf("setting cell_disk_bytes: %v, %+v", err, cfg)
	}
}
