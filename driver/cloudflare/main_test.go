package cloudflare_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// testToken is the bridge token of the local workerd the tests start.
const testToken = "test-token-0123456789abcdef0123456789abcdef"

// testImage is the image the test bridge and the fake Cloudflare API report.
var testImage = "registry.example/sandboxwich-cell@sha256:" + strings.Repeat("c", 64)

// bridgeEnv is one local workerd serving the bridge (scripts/serve.mjs)
// with the real cell agent behind it, shared by the package's tests.
type bridgeEnv struct {
	URL, Manager string
	TokenFile    string
	AgentDigest  string
	dir          string
	cmd          *exec.Cmd
	stdin        io.WriteCloser
	stderr       *lockedBuilder
}

var (
	sharedOnce sync.Once
	shared     *bridgeEnv
	sharedErr  error
)

// startBridge returns the package's local bridge, starting it on first
// use (stopped in TestMain).
func startBridge(t testing.TB) *bridgeEnv {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = launch() })
	if sharedErr != nil {
		testenv.Need(t, "local workerd bridge", sharedErr)
	}
	return shared
}

func launch() (*bridgeEnv, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the loopback container manager needs root")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat("bridge/node_modules/miniflare"); err != nil {
		return nil, fmt.Errorf("bridge/node_modules is not installed (bash scripts/install-node-deps.sh): %w", err)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sbw-cf-test-")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "sandboxwich-agent")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/sandboxwich-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("building the agent: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	tokenFile := filepath.Join(dir, "bridge-token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		return nil, err
	}
	env := &bridgeEnv{TokenFile: tokenFile, AgentDigest: "sha256:" + hex.EncodeToString(sum[:]), dir: dir, stderr: &lockedBuilder{b: &strings.Builder{}}}
	env.cmd = exec.Command(node, "scripts/serve.mjs", "--agent", bin, "--token-file", tokenFile, "--image", testImage, "--instance-type", "basic", "--record")
	env.cmd.Dir = "bridge"
	env.cmd.Stderr = env.stderr
	if env.stdin, err = env.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := env.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := env.cmd.Start(); err != nil {
		return nil, err
	}
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l, ok := <-line:
		var urls struct{ Bridge, Manager string }
		if !ok || json.Unmarshal([]byte(l), &urls) != nil || urls.Bridge == "" {
			env.stop()
			return nil, fmt.Errorf("serve.mjs did not start: %q\n%s", l, env.stderr.String())
		}
		env.URL, env.Manager = urls.Bridge, urls.Manager
	case <-time.After(3 * time.Minute):
		env.stop()
		return nil, fmt.Errorf("serve.mjs did not start in time\n%s", env.stderr.String())
	}
	return env, nil
}

func (e *bridgeEnv) stop() {
	if e.stdin != nil {
		e.stdin.Close()
	}
	done := make(chan struct{})
	go func() { _ = e.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = e.cmd.Process.Kill()
		<-done
	}
	os.RemoveAll(e.dir)
}

type lockedBuilder struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	os.Exit(code)
}
