package kubernetes_test

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/agent/cellagent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// kubeletAgent plays, for kwok's Pods, what a real node does for the
// agent: after Provision it reports the init container's imageID and the
// Pod IP (loopback) and serves the cell's agent, in the test process,
// with the leaf the kubelet would mount from the agent Secret, on the
// provider's agent port.
type kubeletAgent struct {
	*kubernetes.AgentProvider
	t       *testing.T
	env     *k8stest.Env
	ns      string
	imageID string
	ln      net.Listener
	once    sync.Once
}

func (k *kubeletAgent) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	// The kubelet's part runs while Provision waits for the agent.
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.playKubelet(ctx, req.CellID)
	}()
	obj, err := k.AgentProvider.Provision(ctx, req)
	<-done
	return obj, err
}

// playKubelet waits for the cell's Pod to be Running and ready (kwok
// reports it so), then reports the agent init container's imageID and the
// Pod IP, and serves the cell's agent with the mounted Secret's leaf.
func (k *kubeletAgent) playKubelet(ctx context.Context, cellID uuid.UUID) {
	name := kubernetes.PodName(cellID)
	for {
		pod, err := k.env.Client.CoreV1().Pods(k.ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && pod.Status.Phase == corev1.PodRunning && len(pod.Status.ContainerStatuses) > 0 && pod.Status.ContainerStatuses[0].Ready {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	setInitImageID(ctx, k.t, k.env, k.ns, name, k.imageID)
	updateStatus(ctx, k.t, k.env, k.ns, name, func(pod *corev1.Pod) { pod.Status.PodIP = "127.0.0.1" })
	k.once.Do(func() {
		s := getSecret(ctx, k.t, k.env, k.ns, kubernetes.AgentSecretName(cellID))
		pki := &agent.CellPKI{CACert: s.Data[kubernetes.SecretCACert], ServerCert: s.Data[kubernetes.SecretTLSCert], ServerKey: s.Data[kubernetes.SecretTLSKey]}
		cfg, err := pki.ServerConfig(cellID.String())
		if err != nil {
			k.t.Error(err)
			return
		}
		a, err := cellagent.New(cellagent.Config{CellID: cellID.String(), Digest: testAgentDigest, Home: k.t.TempDir()})
		if err != nil {
			k.t.Error(err)
			return
		}
		k.t.Cleanup(a.Shutdown)
		srv := &http.Server{Handler: agent.NewHandler(a), ErrorLog: log.New(io.Discard, "", 0)}
		go srv.Serve(tls.NewListener(k.ln, cfg))
		k.t.Cleanup(func() { srv.Close() })
	})
}

// TestAgentPlane runs the plane over the driver with the agent: a cell is
// admitted only when its agent, reached over the per-cell mTLS channel,
// reports waiting, its own cell and the digest the kubelet ran for the
// agent image; exec, files and launch of a lease then go through it; the
// release proves the Pod and both Secrets gone. A kubelet reporting
// another agent digest gets the cell quarantined (cell_agent_unverified)
// with the same proof.
func TestAgentPlane(t *testing.T) {
	t.Parallel()
	env := k8stest.Shared(t)
	other := "registry.invalid/sandboxwich/agent@sha256:" + strings.Repeat("6", 64)
	for _, tc := range []struct {
		name, imageID string
		ready         bool
	}{{"the pinned agent", testAgentImage, true}, {"another agent digest", other, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			ctx := ctxT(t, 3*time.Minute)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			p := newProvider(t, env, ns, "k8s", withAgent(ln.Addr().(*net.TCPAddr).Port))
			prov := &kubeletAgent{AgentProvider: p.Driver().(*kubernetes.AgentProvider), t: t, env: env, ns: ns, imageID: tc.imageID, ln: ln}
			st, keys := testenv.SQLite(t), testenv.Keyring(t)
			rel := testenv.Release(keys, lease.GVisorLowerRisk)
			c := testenv.NewClock()
			plane, err := sandboxwich.New(st, keys, sandboxwich.WithClock(c.Now), sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
				sandboxwich.WithPools(pool.Config{Name: "k8s", TenantID: "acme", Release: rel, Target: 1, Provider: prov}),
				sandboxwich.WithPoolOptions(pool.WithVerifyInterval(time.Second), pool.WithOrphanInterval(time.Nanosecond),
					pool.WithProvisionTimeout(time.Minute), pool.WithDestroyTimeout(10*time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			c.Advance(2 * time.Second)
			plane.Pools().Pass(ctx)
			ms, err := st.Members(ctx, "k8s")
			if err != nil || len(ms) != 1 {
				t.Fatalf("members %+v %v", ms, err)
			}
			m := ms[0]
			if !tc.ready {
				if m.State != lease.MemberQuarantined || !m.ProviderAbsent {
					t.Fatalf("member %s provider_absent %v: %s", m.State, m.ProviderAbsent, m.LastError)
				}
				sts, err := plane.Pools().Status(ctx)
				if err != nil || !strings.Contains(sts[0].LastError, "cell_agent_unverified") || !strings.Contains(sts[0].LastError, testAgentDigest) {
					t.Fatalf("pool last error %q (%v), want cell_agent_unverified naming the digests", sts[0].LastError, err)
				}
				requireNoPods(t, env, ns)
				requireSecretsGone(ctx, t, env, ns, m.CellID)
				return
			}
			if m.State != lease.MemberReady {
				t.Fatalf("member %s: %s", m.State, m.LastError)
			}
			res, err := plane.Claim(ctx, "acme", sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: rel,
				Binding: lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}})
			if err != nil || res.Lease == nil {
				t.Fatalf("claim: %+v %v", res, err)
			}
			id, pr := res.Lease.ID, res.Proof()
			out, err := plane.Exec(ctx, "acme", id, pr, sandboxwich.ExecRequest{Argv: []string{"sh", "-c", "echo via-agent"}, User: sandboxwich.UserRoot})
			if err != nil || string(out.Stdout) != "via-agent\n" {
				t.Fatalf("exec: %+v %v", out, err)
			}
			if _, err := plane.WriteFile(ctx, "acme", id, pr, sandboxwich.WriteFileRequest{Path: "/tmp/sbw-agentplane-" + id.String(), User: sandboxwich.UserRoot},
				strings.NewReader("file via agent")); err != nil {
				t.Fatal(err)
			}
			rc, _, err := plane.ReadFile(ctx, "acme", id, pr, sandboxwich.ReadFileRequest{Path: "/tmp/sbw-agentplane-" + id.String(), User: sandboxwich.UserRoot})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if string(b) != "file via agent" {
				t.Fatalf("read back %q", b)
			}
			ev, err := plane.Evidence(ctx, "acme", id)
			if err != nil || ev.AgentDigest != testAgentDigest {
				t.Fatalf("evidence %+v %v", ev, err)
			}
			if err := plane.Pools().SetTarget("k8s", 0); err != nil { // no replacement
				t.Fatal(err)
			}
			if _, err := plane.Release(ctx, "acme", id, pr, lease.Destroyed); err != nil {
				t.Fatal(err)
			}
			c.Advance(2 * time.Second)
			plane.Pools().Pass(ctx)
			requireSecretsGone(ctx, t, env, ns, m.CellID)
			if got, err := st.Member(ctx, m.CellID); err != nil || !got.ProviderAbsent {
				t.Fatalf("after release: %+v %v, want provider_absent", got, err)
			}
		})
	}
}
