package kubernetes

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
)

// The cell agent in a Pod (CONTRACT §13), when Config.AgentImage is set.
const (
	// DefaultAgentPort is the Pod port the agent serves mutual TLS on.
	DefaultAgentPort = 7443
	// AgentInitContainerName is the init container that copies the agent
	// from the agent image into the Pod's agent volume.
	AgentInitContainerName = "agent-install"
	// AgentImageBinary is where the agent image holds the static agent.
	AgentImageBinary = "/sandboxwich-agent"
	// agentBinDir is the emptyDir the agent is copied into, mounted
	// read-only into the cell container.
	agentBinDir = "/sbw/bin"
	// agentTLSDir is where the agent Secret is mounted, read-only.
	agentTLSDir = "/sbw/tls"
	// DefaultCertValidity is how long a cell's certificates are valid:
	// longer than any cell lives (a ready TTL plus the longest lease).
	DefaultCertValidity = 30 * 24 * time.Hour
)

// agentBinary is the agent's path in the cell container.
const agentBinary = agentBinDir + "/sandboxwich-agent"

// Driver returns the provider as the plane uses it: with Config.AgentImage
// set, a driver.AgentHost whose exec, files and launch go through the cell
// agent over mutual TLS; otherwise p itself, whose exec goes through
// pods/exec and which has no files or launch.
func (p *Provider) Driver() driver.Provider {
	if p.cfg.AgentImage == "" {
		return p
	}
	return &AgentProvider{p}
}

// AgentProvider is a Provider whose cells run the cell agent: it
// implements driver.AgentHost besides everything Provider does. Provider.Driver
// returns one when Config.AgentImage is set.
type AgentProvider struct{ *Provider }

var _ interface {
	driver.Provider
	driver.Lister
	driver.AgentHost
} = (*AgentProvider)(nil)

// Provision implements driver.Provider: Provider.Provision, then a wait,
// within ctx and Config.ReadyTimeout, until the cell's agent answers its
// status over the channel (Agent): the container runs a moment before the
// agent listens, and the pool reads the agent's readiness evidence at
// once. A Pod gone or ended meanwhile fails at once.
func (a *AgentProvider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	obj, err := a.Provider.Provision(ctx, req)
	if err != nil {
		return obj, err
	}
	if err := a.waitAgent(ctx, obj); err != nil {
		return obj, fmt.Errorf("kubernetes: provision %s: %w", PodName(obj.CellID), err)
	}
	return obj, nil
}

// waitAgent polls the agent's status until it answers.
func (a *AgentProvider) waitAgent(ctx context.Context, obj driver.Object) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.ReadyTimeout)
	defer cancel()
	delay := 20 * time.Millisecond
	for {
		conn, err := a.Agent(ctx, obj)
		if err == nil {
			if _, err = conn.Status(ctx); err == nil {
				return nil
			}
		}
		if errors.Is(err, driver.ErrNotFound) || errors.Is(err, driver.ErrCellLost) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cell agent did not answer within %v: %v", a.cfg.ReadyTimeout, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// agentEntry is a cached channel to one Pod's agent.
type agentEntry struct {
	uid, addr string
	client    *agent.Client
}

// Agent implements driver.AgentHost: a connection to obj's agent at the
// Pod's IP and Config.AgentPort, over TLS 1.3 with the cell's client leaf,
// verifying the agent's leaf against the cell's CA by its URI SAN
// (agent.ClientTLS), never by the address. The Pod and the control Secret
// are read from the API server, so a restarted plane or another replica
// reaches the agent as well. A missing Pod, one of another UID or one
// terminating is driver.ErrNotFound; a Pod that ended (its agent, the
// container's entrypoint, exited) is driver.ErrCellLost.
func (a *AgentProvider) Agent(ctx context.Context, obj driver.Object) (agent.Conn, error) {
	p := a.Provider
	name := PodName(obj.CellID)
	fail := func(err error) (agent.Conn, error) {
		return nil, fmt.Errorf("kubernetes: agent of %s: %w", name, err)
	}
	pod, err := p.pods().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fail(driver.ErrNotFound)
	case err != nil:
		return fail(err)
	case obj.Identity != "" && string(pod.UID) != obj.Identity:
		return fail(fmt.Errorf("%w: the pod is now uid %s", driver.ErrNotFound, pod.UID))
	case pod.DeletionTimestamp != nil:
		return fail(fmt.Errorf("%w: the pod is terminating", driver.ErrNotFound))
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		return fail(fmt.Errorf("%w: the pod is %s", driver.ErrCellLost, pod.Status.Phase))
	case pod.Status.PodIP == "":
		return fail(errors.New("the pod has no IP yet"))
	}
	addr := net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(p.cfg.AgentPort))
	if v, ok := p.agents.Load(obj.CellID); ok {
		if e := v.(*agentEntry); e.uid == string(pod.UID) && e.addr == addr {
			return e.client, nil
		}
	}
	cfg, err := p.controlTLS(ctx, obj.CellID)
	if err != nil {
		return fail(err)
	}
	e := &agentEntry{uid: string(pod.UID), addr: addr, client: agent.NewClient(dialTLS(p.cfg.DialContext, addr, cfg))}
	if old, loaded := p.agents.Swap(obj.CellID, e); loaded {
		old.(*agentEntry).client.CloseIdleConnections()
	}
	return e.client, nil
}

// dialTLS dials addr with dial and completes the TLS handshake with cfg.
func dialTLS(dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string, cfg *tls.Config) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		raw, err := dial(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return conn, nil
	}
}

// dropAgent forgets the cached channel to a cell's agent.
func (p *Provider) dropAgent(cellID uuid.UUID) {
	if v, ok := p.agents.LoadAndDelete(cellID); ok {
		v.(*agentEntry).client.CloseIdleConnections()
	}
}

// admittedAgent is the repo digest the kubelet reports the agent init
// container ran (status.initContainerStatuses[].imageID), or "" when it
// reports none: the agent build digest the plane expects the agent to
// report (CONTRACT §13, §15).
func admittedAgent(pod *corev1.Pod) string {
	for _, cs := range pod.Status.InitContainerStatuses {
		if cs.Name == AgentInitContainerName {
			return driver.RepoDigest(cs.ImageID)
		}
	}
	return ""
}

// agentArgs is the cell container's command with the agent: the agent as
// the launcher (the workload is its child), serving mutual TLS on the
// agent port with the mounted Secret, reporting the agent image's pinned
// digest as its build digest. No credential is in it: the files are
// mounted, and the digest is public.
func (p *Provider) agentArgs(cellID uuid.UUID) []string {
	digest, _ := driver.PinnedDigest(p.cfg.AgentImage)
	var record []string
	if p.cfg.RecordAgentMessages {
		record = []string{"-record", agentRecord}
	}
	return append([]string{agentBinary,
		"-listen", "tcp:0.0.0.0:" + strconv.Itoa(p.cfg.AgentPort),
		"-cell-id", cellID.String(),
		"-home", agent.DefaultHome,
		"-tls-cert", agentTLSDir + "/" + SecretTLSCert,
		"-tls-key", agentTLSDir + "/" + SecretTLSKey,
		"-tls-client-ca", agentTLSDir + "/" + SecretCACert,
		"-digest", digest,
	}, record...)
}

// agentRecord is the file of Config.RecordAgentMessages.
const agentRecord = "/tmp/.sandboxwich-agent-record"

// AgentMessages returns, with Config.RecordAgentMessages (for tests
// only), every request the cell's agent received, as the agent writes
// them, read through pods/exec: it works until the Pod is gone.
func (a *AgentProvider) AgentMessages(ctx context.Context, obj driver.Object) ([]byte, error) {
	if !a.cfg.RecordAgentMessages {
		return nil, errors.New("kubernetes: agent messages are recorded only with Config.RecordAgentMessages")
	}
	res, err := a.Provider.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"cat", agentRecord}, MaxOutput: 64 << 20})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("kubernetes: agent messages of %s: cat exited %d: %s", PodName(obj.CellID), res.ExitCode, res.Stderr)
	}
	return res.Stdout, nil
}
