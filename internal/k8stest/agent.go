package k8stest

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

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
		cmd := exec.Command(goBin, "build", "-trimpath", "-o", bin, "github.com/sandboxwich/sandboxwich/cmd/sandboxwich-agent")
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
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	name := strings.TrimPrefix(kubernetes.AgentImageBinary, "/")
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = runtime.GOARCH, "linux"
	cf.Config.Entrypoint = []string{kubernetes.AgentImageBinary}
	cf.Config.User = "1000:1000"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}
