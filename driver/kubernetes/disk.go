package kubernetes

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// cellDisk fills in and checks a cell's writable storage (Config
// CellDiskBytes, the pool key cell_disk_bytes, CONTRACT §25) once the
// memory limit is parsed: default TmpSize when set (its older name),
// else half the memory; it must be below the memory, as the cell's
// writable directories are memory-backed.
func (p *Provider) cellDisk(cfg *Config) error {
	n := cfg.CellDiskBytes
	if cfg.TmpSize != "" {
		q, err := resource.ParseQuantity(cfg.TmpSize)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("kubernetes: tmp_size %q is not a positive quantity", cfg.TmpSize)
		}
		switch {
		case n == 0:
			n = q.Value()
		case n != q.Value():
			return fmt.Errorf("kubernetes: key cell_disk_bytes: %d differs from tmp_size %s, its older name", n, cfg.TmpSize)
		}
	}
	mem := p.memory.Value()
	if n == 0 {
		n = mem / 2
	}
	switch {
	case n < MinCellDiskBytes:
		return fmt.Errorf("kubernetes: key cell_disk_bytes: %d is below %d bytes", n, MinCellDiskBytes)
	case n >= mem:
		return fmt.Errorf("kubernetes: key cell_disk_bytes: %d is not below the cell's memory (memory %s = %d): "+
			"a cell's writable directories are memory-backed", n, p.memory.String(), mem)
	}
	cfg.CellDiskBytes = n
	return nil
}

// MinCellDiskBytes is the smallest Config.CellDiskBytes.
const MinCellDiskBytes = 1 << 20

// diskShares are the sizes of the cell container's writable emptyDirs,
// which together make Config.CellDiskBytes: /tmp alone, or /tmp and the
// agent's home (with Config.AgentImage) half each.
func (p *Provider) diskShares() (tmp, home int64) {
	n := p.cfg.CellDiskBytes
	if p.cfg.AgentImage == "" {
		return n, 0
	}
	return n / 2, n - n/2
}

// cellVolume is a memory-backed emptyDir of n bytes: the kubelet mounts a
// tmpfs of that size, so a full one is ENOSPC in the cell, and its pages
// count against the Pod's memory.
func cellVolume(name string, n int64) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(n, resource.BinarySI)}}}
}

// unboundedDisk reports what in an admitted Pod lets the cell container
// write more than Config.CellDiskBytes: its ephemeral-storage limit
// missing or larger, or emptyDirs it mounts writable without a size
// limit or larger together. "" when nothing does.
func (p *Provider) unboundedDisk(pod *corev1.Pod) string {
	n := p.cfg.CellDiskBytes
	var cell *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == ContainerName {
			cell = &pod.Spec.Containers[i]
		}
	}
	if cell == nil {
		return ""
	}
	if q, ok := cell.Resources.Limits[corev1.ResourceEphemeralStorage]; !ok || q.Value() > n {
		return fmt.Sprintf("admitted container %q has no ephemeral-storage limit of at most cell_disk_bytes (%d)", ContainerName, n)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	var total int64
	for _, m := range cell.VolumeMounts {
		v, ok := volumes[m.Name]
		if m.ReadOnly || !ok || v.EmptyDir == nil {
			continue
		}
		if v.EmptyDir.SizeLimit == nil {
			return fmt.Sprintf("admitted emptyDir %q mounted at %s has no size limit", m.Name, m.MountPath)
		}
		total += v.EmptyDir.SizeLimit.Value()
	}
	if total > n {
		return fmt.Sprintf("admitted emptyDirs of container %q hold %d bytes, more than cell_disk_bytes (%d)", ContainerName, total, n)
	}
	return ""
}
