package kubernetes

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/lease"
)

type podClient = typedcorev1.PodInterface

// podLabels are the labels of a cell's Pod.
func (p *Provider) podLabels(cellID uuid.UUID, class lease.RuntimeClass) map[string]string {
	return map[string]string{
		LabelManagedBy:    ManagedByValue,
		LabelPool:         p.cfg.Pool,
		LabelInstallation: p.cfg.Installation,
		LabelCellID:       cellID.String(),
		LabelRuntimeClass: string(class),
	}
}

// podSpec is the Pod of one cell: one container from the digest-pinned
// image (recorded in AnnotationImage) under the RuntimeClass named
// rcName, no service-account token, no service links, no host
// namespaces, non-root with every capability dropped, a read-only root
// file system with a memory-backed /tmp whose size (with the agent's
// home) is Config.CellDiskBytes, seccomp RuntimeDefault, resource limits
// (ephemeral-storage CellDiskBytes too), restartPolicy Never.
func (p *Provider) podSpec(cellID uuid.UUID, class lease.RuntimeClass, rcName, image string) *corev1.Pod {
	uid := p.cfg.RunAsUser
	grace := int64(p.cfg.TerminationGracePeriod.Seconds())
	limits := corev1.ResourceList{corev1.ResourceCPU: p.cpu, corev1.ResourceMemory: p.memory,
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(p.cfg.CellDiskBytes, resource.BinarySI)}
	tmp, home := p.diskShares()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(cellID),
			Namespace:   p.cfg.Namespace,
			Labels:      p.podLabels(cellID, class),
			Annotations: map[string]string{AnnotationImage: image},
		},
		Spec: corev1.PodSpec{
			RuntimeClassName:              ptr(rcName),
			NodeName:                      p.cfg.NodeName,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			ShareProcessNamespace:         ptr(false),
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr(true),
				RunAsUser:      &uid,
				RunAsGroup:     &uid,
				FSGroup:        &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            ContainerName,
				Image:           image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         slices.Clone(p.cfg.Command),
				WorkingDir:      "/tmp",
				Resources:       corev1.ResourceRequirements{Limits: limits, Requests: limits},
				SecurityContext: &corev1.SecurityContext{
					Privileged:               ptr(false),
					AllowPrivilegeEscalation: ptr(false),
					ReadOnlyRootFilesystem:   ptr(true),
					RunAsNonRoot:             ptr(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				VolumeMounts:             []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: []corev1.Volume{cellVolume("tmp", tmp)},
		},
	}
	if p.cfg.AgentImage != "" {
		p.addAgent(pod, cellID, home)
	}
	return pod
}

// Volumes of a cell with the agent.
const (
	agentBinVolume  = "sbw-agent-bin"
	agentTLSVolume  = "sbw-agent-tls"
	agentHomeVolume = "sbw-home"
)

// addAgent makes the cell agent the cell container's entrypoint: an init
// container from the digest-pinned agent image copies the static agent
// into an emptyDir, which the cell container mounts read-only and runs
// as its launcher (agentArgs), with the agent Secret mounted read-only
// (files readable by the cell's group only) and a writable home. The
// control Secret is mounted nowhere; no credential is in an env or an
// argument.
func (p *Provider) addAgent(pod *corev1.Pod, cellID uuid.UUID, home int64) {
	s := &pod.Spec
	cell := &s.Containers[0]
	small := resource.MustParse("64Mi")
	s.InitContainers = []corev1.Container{{
		Name:                     AgentInitContainerName,
		Image:                    p.cfg.AgentImage,
		ImagePullPolicy:          corev1.PullIfNotPresent,
		Command:                  []string{AgentImageBinary, "-install", agentBinary},
		Resources:                cell.Resources,
		SecurityContext:          cell.SecurityContext.DeepCopy(),
		VolumeMounts:             []corev1.VolumeMount{{Name: agentBinVolume, MountPath: agentBinDir}},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}}
	cell.Command = p.agentArgs(cellID)
	cell.Ports = []corev1.ContainerPort{{Name: "agent", ContainerPort: int32(p.cfg.AgentPort), Protocol: corev1.ProtocolTCP}}
	cell.VolumeMounts = append(cell.VolumeMounts,
		corev1.VolumeMount{Name: agentBinVolume, MountPath: agentBinDir, ReadOnly: true},
		corev1.VolumeMount{Name: agentTLSVolume, MountPath: agentTLSDir, ReadOnly: true},
		corev1.VolumeMount{Name: agentHomeVolume, MountPath: agent.DefaultHome},
	)
	s.Volumes = append(s.Volumes,
		corev1.Volume{Name: agentBinVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &small}}},
		corev1.Volume{Name: agentTLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: AgentSecretName(cellID), DefaultMode: ptr(int32(0o440)),
		}}},
		cellVolume(agentHomeVolume, home),
	)
}

// NetworkPolicyName is the name of the deny-all NetworkPolicy of a pool.
func NetworkPolicyName(pool string) string { return "sandboxwich-" + pool + "-deny-all" }

// networkPolicy is the pool's deny-all policy: it selects the pool's Pods
// and allows no ingress and no egress.
func (p *Provider) networkPolicy() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name:      NetworkPolicyName(p.cfg.Pool),
			Namespace: p.cfg.Namespace,
			Labels:    map[string]string{LabelManagedBy: ManagedByValue, LabelPool: p.cfg.Pool},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedByValue, LabelPool: p.cfg.Pool}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// ensureNetworkPolicy creates the pool's deny-all NetworkPolicy, or checks
// that the existing one still denies everything, once per Provider. It is
// a no-op when Config.NetworkPolicy is false. The API server stores the
// policy; a CNI plugin that enforces NetworkPolicy is what applies it.
func (p *Provider) ensureNetworkPolicy(ctx context.Context) error {
	if p.cfg.NetworkPolicy != nil && !*p.cfg.NetworkPolicy {
		return nil
	}
	p.npMu.Lock()
	defer p.npMu.Unlock()
	if p.npOK {
		return nil
	}
	want := p.networkPolicy()
	nps := p.client.NetworkingV1().NetworkPolicies(p.cfg.Namespace)
	_, err := nps.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var got *networkingv1.NetworkPolicy
		if got, err = nps.Get(ctx, want.Name, metav1.GetOptions{}); err == nil {
			err = denyAll(got, want)
		}
	}
	if err != nil {
		return fmt.Errorf("kubernetes: network policy %s/%s: %w", p.cfg.Namespace, want.Name, err)
	}
	p.npOK = true
	p.log.Info("deny-all network policy in place", "network_policy", want.Name)
	return nil
}

// denyAll checks that got selects the pods want selects and allows
// nothing in either direction.
func denyAll(got, want *networkingv1.NetworkPolicy) error {
	s := got.Spec
	hasType := func(t networkingv1.PolicyType) bool { return slices.Contains(s.PolicyTypes, t) }
	sel := s.PodSelector
	switch {
	case len(sel.MatchExpressions) > 0 || len(sel.MatchLabels) > len(want.Spec.PodSelector.MatchLabels):
		return fmt.Errorf("exists but selects pods by %v, not only by the pool's labels", sel)
	case !hasType(networkingv1.PolicyTypeIngress) || !hasType(networkingv1.PolicyTypeEgress):
		return fmt.Errorf("exists but does not cover both ingress and egress (policyTypes %v)", s.PolicyTypes)
	case len(s.Ingress) > 0 || len(s.Egress) > 0:
		return fmt.Errorf("exists but allows traffic (%d ingress, %d egress rules)", len(s.Ingress), len(s.Egress))
	}
	for k, v := range sel.MatchLabels {
		if want.Spec.PodSelector.MatchLabels[k] != v {
			return fmt.Errorf("exists but selects %s=%s", k, v)
		}
	}
	return nil
}
