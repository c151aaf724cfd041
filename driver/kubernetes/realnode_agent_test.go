package kubernetes_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// withRealAgent pushes the agent image to a registry of the node and
// returns the configuration that runs it: agent_image pinned by the
// pushed digest, the agents dialled through the node's network namespace.
func withRealAgent(t testing.TB, node *k8stest.Node) (edit func(*kubernetes.Config), digest string) {
	t.Helper()
	ref := node.AgentImage(t)
	return func(c *kubernetes.Config) {
		c.AgentImage = ref
		c.DialContext = node.DialContext
	}, ref[strings.LastIndexByte(ref, '@')+1:]
}

// agentOnly is the driver as the plane uses it with an agent, without
// Provider's pods/exec: the suite's exec cases go through the agent.
type agentOnly struct {
	agentHost
}

type agentHost interface {
	driver.Provider
	driver.Lister
	driver.AgentHost
}

// realAgentHarness makes agent providers on the real node.
type realAgentHarness struct {
	node *k8stest.Node
	ns   string
	edit func(*kubernetes.Config)
}

func (h realAgentHarness) MakeProvider(ctx context.Context, t *testing.T) (driver.Provider, error) {
	return agentOnly{newRealProvider(t, h.node, h.ns, "agent", h.edit).Driver().(agentHost)}, nil
}

func (h realAgentHarness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

func (h realAgentHarness) Images(t *testing.T) []drivertest.TestImage { return markedImages(t, h.node) }

// TestRealNodeAgentConformance runs all of driver/drivertest, the Agent
// case included, with the cell agent in real gVisor Pods: exec and files
// through the agent over per-cell mutual TLS. No Secret outlives its cell.
func TestRealNodeAgentConformance(t *testing.T) {
	node := k8stest.SharedNode(t)
	edit, _ := withRealAgent(t, node)
	h := realAgentHarness{node: node, ns: node.Namespace(t), edit: edit}
	drivertest.Run(t, h)
	requireNoPods(t, node.Env, h.ns)
	secrets, err := node.Client.CoreV1().Secrets(h.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		t.Errorf("secret %s outlived the suite's cells", s.Name)
	}
	if t.Failed() {
		t.Logf("kubelet log:\n%s", node.Log("kubelet"))
	}
}

// agentRun runs argv through conn, activated for a fresh lease on the
// first call (act is kept by the caller).
func agentRun(ctx context.Context, t testing.TB, conn agent.Conn, act *agent.Activation, argv ...string) agent.ExecResult {
	t.Helper()
	res, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Activation: act, Argv: argv,
		TimeoutMillis: time.Minute.Milliseconds(), MaxOutput: 64 << 20}, nil)
	if err != nil {
		t.Fatalf("exec %q through the agent: %v", argv, err)
	}
	return res
}

func newActivation(cellID uuid.UUID) *agent.Activation {
	f := agent.Fence{CellID: cellID.String(), LeaseID: uuid.NewString(), Generation: 1}
	return &agent.Activation{Version: agent.ProtocolVersion, Fence: f, ExpiresAt: time.Now().Add(time.Hour), TTLMillis: time.Hour.Milliseconds()}
}

// TestRealNodeAgentNoCredentialInPod: on the real node, the agent reports
// the digest the kubelet ran for its init container; the control Secret
// is mounted nowhere, and neither the control leaf's key nor the CA key
// reaches the Pod — not its spec (env, args, mounts), not PID 1's
// environment or arguments, not any file the cell can read; the agent
// Secret's mount holds the server's files only. Destroy deletes both
// Secrets.
func TestRealNodeAgentNoCredentialInPod(t *testing.T) {
	node := k8stest.SharedNode(t)
	ns := node.Namespace(t)
	edit, digest := withRealAgent(t, node)
	p := newRealProvider(t, node, ns, "agent-creds", edit)
	host := p.Driver().(*kubernetes.AgentProvider)
	ctx := ctxT(t, 4*time.Minute)
	obj, err := host.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		t.Fatalf("Provision: %v\nkubelet log:\n%s", err, node.Log("kubelet"))
	}
	destroyed := false
	defer func() {
		if !destroyed {
			_ = host.Destroy(context.Background(), obj)
		}
	}()
	o, err := host.Inspect(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.Verify(obj, o, lease.GVisorLowerRisk); err != nil {
		t.Fatal(err)
	}

	pod, err := node.Client.CoreV1().Pods(ns).Get(ctx, kubernetes.PodName(obj.CellID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name == kubernetes.AgentInitContainerName && !strings.HasSuffix(cs.ImageID, "/agent@"+digest) {
			t.Errorf("init container imageID = %q, want the repo digest …/agent@%s", cs.ImageID, digest)
		}
	}
	control := getSecret(ctx, t, node.Env, ns, kubernetes.ControlSecretName(obj.CellID))
	agentSecret := kubernetes.AgentSecretName(obj.CellID)
	// The secret material that must stay with the plane: the control
	// Secret's private keys (the CA's and the control leaf's), whole and
	// line by line (a copy in another framing is found too), less the
	// lines the agent Secret shares with them (a PEM key's first line is
	// mostly its algorithm's fixed ASN.1 header).
	served := getSecret(ctx, t, node.Env, ns, agentSecret)
	public := map[string]bool{}
	for _, v := range served.Data {
		for _, line := range strings.Split(string(v), "\n") {
			public[line] = true
		}
	}
	var secrets [][]byte
	for _, k := range []string{kubernetes.SecretCAKey, kubernetes.SecretTLSKey} {
		v := control.Data[k]
		if len(v) == 0 {
			t.Fatalf("control Secret %s has no %s: %v", control.Name, k, slices.Collect(maps.Keys(control.Data)))
		}
		secrets = append(secrets, v)
		for _, line := range strings.Split(string(v), "\n") {
			if len(line) >= 40 && !strings.HasPrefix(line, "-----") && !public[line] {
				secrets = append(secrets, []byte(line))
			}
		}
	}
	leaks := func(where string, b []byte) {
		t.Helper()
		for i, s := range secrets {
			if j := bytes.Index(b, s); j >= 0 {
				t.Errorf("control key material (%d) in %s: …%q…", i, where, b[max(j-200, 0):j])
				return
			}
		}
	}

	// The Pod spec: Secret volumes are the agent Secret only; no env from
	// a Secret; no credential in a command or an argument.
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName != agentSecret {
			t.Errorf("volume %s mounts Secret %s; only %s may be mounted", v.Name, v.Secret.SecretName, agentSecret)
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					t.Errorf("projected volume %s mounts Secret %s", v.Name, src.Secret.Name)
				}
			}
		}
	}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				t.Errorf("container %s: env %s from Secret %s", c.Name, e.Name, e.ValueFrom.SecretKeyRef.Name)
			}
			leaks("container "+c.Name+" env "+e.Name, []byte(e.Value))
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				t.Errorf("container %s: envFrom Secret %s", c.Name, ef.SecretRef.Name)
			}
		}
		leaks("container "+c.Name+" command", []byte(strings.Join(append(append([]string{}, c.Command...), c.Args...), "\x00")))
	}
	spec, err := pod.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	leaks("the Pod object", spec)

	// Inside the Pod, through the agent over mTLS.
	conn, err := host.Agent(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	st, err := conn.Status(ctx)
	if err != nil || st.Digest != digest || st.CellID != obj.CellID.String() {
		t.Fatalf("agent status %+v, %v; want cell %s, digest %s", st, err, obj.CellID, digest)
	}
	act := newActivation(obj.CellID)
	// The agent is not dumpable: the cell's commands cannot read its
	// environment (if they could, it must hold no credential).
	res := agentRun(ctx, t, conn, act, "cat", "/proc/1/environ")
	leaks("PID 1's environment", res.Stdout)
	if res.ExitCode == 0 {
		t.Logf("PID 1's environment is readable by the cell user: %q", res.Stdout)
	}
	// The container's environment as the runtime gives it (pods/exec, a
	// process the kubelet starts beside the agent) and as the agent gives
	// its commands.
	env, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"env"}, Timeout: time.Minute, MaxOutput: 1 << 20})
	if err != nil || env.ExitCode != 0 {
		t.Fatalf("env through pods/exec: %+v, %v", env, err)
	}
	leaks("the container's environment", env.Stdout)
	res = agentRun(ctx, t, conn, act, "env")
	leaks("a command's environment", res.Stdout)
	for _, kv := range strings.Fields(string(env.Stdout) + "\n" + string(res.Stdout)) {
		if k := strings.ToUpper(kv[:max(strings.IndexByte(kv, '='), 0)]); strings.Contains(k, "KEY") || strings.Contains(k, "TOKEN") ||
			strings.Contains(k, "SECRET") || strings.Contains(k, "ATTEST") {
			t.Errorf("the cell's environment has %q", kv)
		}
	}
	res = agentRun(ctx, t, conn, act, "cat", "/proc/1/cmdline")
	if res.ExitCode == 0 && !bytes.HasPrefix(res.Stdout, []byte("/sbw/bin/sandboxwich-agent\x00")) {
		t.Errorf("PID 1's cmdline = %q, want the agent", res.Stdout)
	}
	leaks("PID 1's arguments", res.Stdout)
	res = agentRun(ctx, t, conn, act, "cat", "/proc/self/mountinfo")
	if res.ExitCode != 0 {
		t.Fatalf("cat /proc/self/mountinfo: exit %d, %q", res.ExitCode, res.Stderr)
	}
	if strings.Contains(string(res.Stdout), kubernetes.ControlSecretName(obj.CellID)) {
		t.Errorf("the control Secret is mounted:\n%s", res.Stdout)
	}
	res = agentRun(ctx, t, conn, act, "ls", "-A", "/sbw/tls")
	if got := strings.Fields(string(res.Stdout)); res.ExitCode != 0 || !onlyServerFiles(got) {
		t.Errorf("the agent Secret's mount holds %q (exit %d), want the CA certificate and the server leaf only", got, res.ExitCode)
	}
	// Every file the cell can read, outside /proc and /sys, read back in
	// the test process (the key material never goes into the cell to look
	// for itself).
	res = agentRun(ctx, t, conn, act, "sh", "-c",
		"find / -path /proc -prune -o -path /sys -prune -o -type f -print | while read -r f; do cat \"$f\" 2>/dev/null; done")
	if res.Truncated || len(res.Stdout) < 1<<20 {
		t.Fatalf("reading the cell's files: %d bytes, truncated %v, stderr %q", len(res.Stdout), res.Truncated, res.Stderr)
	}
	leaks("a file in the cell", res.Stdout)
	// The scan sees what is there: the agent's own key, mounted from
	// the agent Secret, is among the files read.
	if !bytes.Contains(res.Stdout, served.Data[kubernetes.SecretTLSKey]) {
		t.Error("the cell's files do not hold the agent Secret's key: the scan missed the mount")
	}

	if err := host.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	destroyed = true
	requireNoPods(t, node.Env, ns)
	requireSecretsGone(ctx, t, node.Env, ns, obj.CellID)
}

// onlyServerFiles reports whether the agent Secret's mount lists only the
// server's files (the kubelet's ..data links aside).
func onlyServerFiles(names []string) bool {
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, ".."):
		case n == kubernetes.SecretCACert, n == kubernetes.SecretTLSCert, n == kubernetes.SecretTLSKey:
		default:
			return false
		}
	}
	return true
}

// BenchmarkRealNodeAgentFirstOutput measures, on an activated agent in a
// ready gVisor Pod, `echo` through the agent over mTLS (the channel the
// plane keeps per cell) against the same command in the same Pod through
// pods/exec (the API server and the kubelet: the driver's kubectl-exec
// path), the two taking turns. Both are timed to the command's completion
// (for echo, its output arrives with its exit). It reports
// agent_first_output_ratio, the median of the per-turn ratios (target
// ≤ 0.2), both medians in ms, and the median of an agent status round
// trip (the channel without a process) in ms.
//
// The cell has the driver's default CPU limit (DefaultCPU), not the
// suite's 50m: under 50m the Pod's CFS quota (5 ms of CPU a 100 ms
// period) throttles both paths to multiples of 100 ms, and the agent's
// more (its process starts inside the sandbox), which measures the quota.
//
//	go test -run '^$' -bench RealNodeAgentFirstOutput -benchtime 1x ./driver/kubernetes/
func BenchmarkRealNodeAgentFirstOutput(b *testing.B) {
	const turns = 41
	node := k8stest.SharedNode(b)
	ns := node.Namespace(b)
	edit, _ := withRealAgent(b, node)
	p := newRealProvider(b, node, ns, "agent-bench", edit, func(c *kubernetes.Config) { c.CPU = kubernetes.DefaultCPU })
	host := p.Driver().(*kubernetes.AgentProvider)
	ctx := ctxT(b, 10*time.Minute)
	obj, err := host.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
	if err != nil {
		b.Fatalf("Provision: %v", err)
	}
	defer func() {
		if err := host.Destroy(context.Background(), obj); err != nil {
			b.Errorf("Destroy: %v", err)
		}
	}()
	conn, err := host.Agent(ctx, obj)
	if err != nil {
		b.Fatal(err)
	}
	act := newActivation(obj.CellID)
	viaAgent := func() time.Duration {
		start := time.Now()
		res, err := conn.Exec(ctx, agent.ExecRequest{Fence: act.Fence, Activation: act, Argv: []string{"echo", "hi"}}, nil)
		d := time.Since(start)
		if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hi\n" {
			b.Fatalf("echo through the agent: %+v, %v", res, err)
		}
		return d
	}
	viaPodsExec := func() time.Duration {
		start := time.Now()
		res, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"echo", "hi"}, Timeout: time.Minute, MaxOutput: 1 << 10})
		d := time.Since(start)
		if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hi\n" {
			b.Fatalf("echo through pods/exec: %+v, %v", res, err)
		}
		return d
	}
	viaAgent() // activates the agent
	viaPodsExec()
	// The channel alone: a status round trip, no process.
	var statuses []float64
	for range turns {
		start := time.Now()
		if _, err := conn.Status(ctx); err != nil {
			b.Fatal(err)
		}
		statuses = append(statuses, float64(time.Since(start).Microseconds())/1000)
	}
	var ratios, agents, execs []float64
	for b.Loop() {
		for i := range turns {
			var a, e time.Duration
			if i%2 == 0 {
				a, e = viaAgent(), viaPodsExec()
			} else {
				e, a = viaPodsExec(), viaAgent()
			}
			ratios = append(ratios, float64(a)/float64(e))
			agents = append(agents, float64(a.Microseconds())/1000)
			execs = append(execs, float64(e.Microseconds())/1000)
		}
	}
	b.Logf("per turn: agent ms %.0f; pods/exec ms %.0f; agent status ms %.1f", agents, execs, statuses)
	b.Logf("echo: agent median %.2f ms, pods/exec median %.2f ms, ratio %.3f over %d turns",
		median(agents), median(execs), median(ratios), len(ratios))
	b.ReportMetric(median(ratios), "agent_first_output_ratio")
	b.ReportMetric(median(agents), "agent_ms")
	b.ReportMetric(median(execs), "podsexec_ms")
	b.ReportMetric(median(statuses), "agent_status_ms")
}
