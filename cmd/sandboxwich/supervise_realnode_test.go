package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// TestSuperviseRealNode runs TestSupervise's cases with the pool's cells
// in gVisor Pods on a real node (kubelet, containerd, runsc), the agent in
// each behind its per-cell mTLS: what the supervisor holds never reaches
// the tenant Pod — its spec (env, command), its Secrets and mounts, its
// files and processes, its agent's messages.
func TestSuperviseRealNode(t *testing.T) {
	node := k8stest.StartNode(t)
	ns := node.Namespace(t)
	kp, err := kubernetes.New(kubernetes.Config{RESTConfig: node.Config, Namespace: ns, Pool: cliTestPool,
		Installation: driver.InstallationTag("supervise-" + ns), Image: node.BusyboxImage, NodeName: node.NodeName,
		RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor"},
		// 250m: three cells and their replacements fit the node's 2 CPUs
		// (a 50m quota would make every command take 100 ms steps).
		CPU: "250m", Memory: "256Mi", ReadyTimeout: 2 * time.Minute, TerminationGracePeriod: time.Second,
		AgentImage: node.AgentImage(t), DialContext: node.DialContext, RecordAgentMessages: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	prov := kp.Driver().(*kubernetes.AgentProvider)
	s := &superviseServer{cells: prov, record: prov.AgentMessages, scanUser: agent.UserCell,
		more: func(t *testing.T, cell uuid.UUID) map[string][]byte {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pod, err := node.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(cell), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			secrets, err := node.Client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			spec, _ := json.Marshal(pod)
			var data []byte // the Secrets' values, decoded
			for _, sec := range secrets.Items {
				for _, v := range sec.Data {
					data = append(append(data, v...), '\n')
				}
			}
			return map[string][]byte{"the Pod's spec and status": spec, "the namespace's Secrets": data}
		}}
	startSuperviseServer(t, prov, 3, s, func() {})
	testSupervise(t, s)
}
