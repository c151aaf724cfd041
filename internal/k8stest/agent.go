package k8stest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/sandboxwich/sandboxwich/driver/kubernetes"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// AgentImage builds the static sandboxwich-agent (once per test binary),
// packs it into the image deploy/kubernetes/agent.Dockerfile makes (the
// agent alone at kubernetes.AgentImageBinary), pushes it to the node's
// registry and returns its reference pinned by digest: a kubernetes
// pool's agent_image.
func (n *Node) AgentImage(tb testing.TB) string {
	tb.Helper()
	return n.Registry(tb).Push(tb, "agent", agentImage(tb, buildAgentBinary(tb)))
}

var agentBuild struct {
	once sync.Once
	bin  string
	err  error
}

// buildAgentBinary builds cmd/sandboxwich-agent once per test binary,
// static (CGO_ENABLED=0), as deploy/kubernetes/agent.Dockerfile does.
func buildAgentBinary(t testing.TB) string {
	t.Helper()
	agentBuild.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			agentBuild.err = err
			return
		}
		dir, err := os.MkdirTemp("", "sbw-k8s-agent-")
		if err != nil {
			agentBuild.err = err
			return
		}
		bin := filepath.Join(dir, "sandboxwich-agent")
		cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "github.com/sandboxwich/sandboxwich/cmd/sandboxwich-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBuild.err = &buildError{err: err, out: string(out)}
			return
		}
		agentBuild.bin = bin
	})
	testenv.Need(t, "go command", agentBuild.err)
	f, err := elf.Open(agentBuild.bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the agent is not static: it has a %v program header", p.Type)
		}
	}
	return agentBuild.bin
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + e.out }

// agentImage is the agent image of deploy/kubernetes/agent.Dockerfile:
// the static agent alone at kubernetes.AgentImageBinary.
func agentImage(t testing.TB, bin string) v1.Image {
	t.Helper()
	body, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	img, err := layerImage([]tarFile{{name: strings.TrimPrefix(kubernetes.AgentImageBinary, "/"), mode: 0o755, body: body}},
		[]string{kubernetes.AgentImageBinary})
	if err == nil {
		img, err = withUser(img, "1000:1000")
	}
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// withUser sets the user an image's entrypoint runs as.
func withUser(img v1.Image, user string) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Config.User = user
	return mutate.ConfigFile(img, cf)
}
