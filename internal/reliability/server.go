package reliability

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	_ "github.com/lib/pq" // PostgreSQL databases of the runs

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Env is what every check shares: a scratch directory, a signing key, the
// tokens and the signed release the servers are configured with.
type Env struct {
	Dir           string
	KeyFile       string
	Keys          *attest.Keyring
	TenantToken   string
	OperatorToken string
	WorkerID      uuid.UUID
	WorkerToken   string
	Release       lease.Release
	Log           *slog.Logger
}

// Tenant is the tenant of every run.
const Tenant = "rel"

// NewEnv makes a signing key and tokens under dir.
func NewEnv(dir string, log *slog.Logger) (*Env, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir, KeyFile: filepath.Join(dir, "signing.key"), Log: log,
		TenantToken: "tok_" + randHex(16), OperatorToken: "op_" + randHex(16),
		WorkerID: uuid.Must(uuid.NewV7()), WorkerToken: "sbw_wtok_" + randHex(16)}
	if err := attest.GenerateKeyFile(e.KeyFile); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	keys, err := attest.LoadKeyFile(e.KeyFile)
	if err != nil {
		return nil, err
	}
	e.Keys = keys
	digest := strings.Repeat("ab", 32)
	e.Release = lease.Release{ReleaseSetID: "rel-reliability", RuntimeClass: lease.GVisorLowerRisk,
		PolicyDigest: digest, Signature: keys.SignRelease(lease.Release{ReleaseSetID: "rel-reliability", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: digest})}
	return e, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// PoolSpec is the single pool a server runs (none when Target is 0).
type PoolSpec struct {
	Provider        string // "dry-run", "dir" or "gvisor"
	Target          int
	MaxProvisioning int
	// Images makes the pool an image class allowing this pattern
	// (CONTRACT §21): Target is its max_cells, MaxProvisioning its
	// max_cold.
	Images          string
	ReadyTTLSeconds int
	// Settings are provider settings (SANDBOXWICH_<PROVIDER>_<KEY>).
	Settings map[string]string
}

// ServerSpec describes one server process.
type ServerSpec struct {
	// Bin is the program; Args its arguments (e.g. "serve").
	Bin  string
	Args []string
	// DatabaseURL is sqlite:///abs/path or postgres://…
	DatabaseURL string
	Pool        PoolSpec
	// SweepMillis is SANDBOXWICH_SWEEP_INTERVAL_MS (default 200).
	SweepMillis int
	// Extra environment variables.
	Extra []string
	// LogFile receives the server's output.
	LogFile string
}

// Server is a running server process.
type Server struct {
	URL  string
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// environ returns the environment of a server: the harness's own PATH and
// HOME only, plus the configuration.
func (e *Env) environ(s ServerSpec, addr string) []string {
	sweep := s.SweepMillis
	if sweep == 0 {
		sweep = 200
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(),
		"SANDBOXWICH_LISTEN=" + addr,
		"SANDBOXWICH_DATABASE_URL=" + s.DatabaseURL,
		"SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE=" + e.KeyFile,
		"SANDBOXWICH_TENANT_TOKENS=" + Tenant + "=" + e.TenantToken,
		"SANDBOXWICH_OPERATOR_TOKEN=" + e.OperatorToken,
		"SANDBOXWICH_WORKER_TOKENS=" + e.WorkerID.String() + "@" + Tenant + ":gvisor_lower_risk|kata_microvm=" + e.WorkerToken,
		"SANDBOXWICH_SWEEP_INTERVAL_MS=" + strconv.Itoa(sweep),
		"SANDBOXWICH_LOG_LEVEL=warn",
		"SANDBOXWICH_SHUTDOWN_TIMEOUT_MS=2000",
	}
	if p := s.Pool; p.Target > 0 {
		ttl := p.ReadyTTLSeconds
		if ttl == 0 {
			ttl = 3600
		}
		maxProv := p.MaxProvisioning
		if maxProv == 0 {
			maxProv = p.Target
		}
		size := []string{"SANDBOXWICH_STERILE_POOL_TARGET=" + strconv.Itoa(p.Target),
			"SANDBOXWICH_STERILE_POOL_MAX_PROVISIONING=" + strconv.Itoa(maxProv)}
		if p.Images != "" {
			size = []string{"SANDBOXWICH_STERILE_POOL_IMAGES=" + p.Images,
				"SANDBOXWICH_STERILE_POOL_MAX_CELLS=" + strconv.Itoa(p.Target),
				"SANDBOXWICH_STERILE_POOL_MAX_COLD=" + strconv.Itoa(maxProv)}
		}
		env = append(append(env, size...),
			"SANDBOXWICH_STERILE_POOL_NAME=rel",
			"SANDBOXWICH_STERILE_POOL_PROVIDER="+p.Provider,
			"SANDBOXWICH_STERILE_POOL_TENANT_ID="+Tenant,
			"SANDBOXWICH_STERILE_POOL_READY_TTL_SECONDS="+strconv.Itoa(ttl),
			"SANDBOXWICH_STERILE_POOL_RELEASE_SET_ID="+e.Release.ReleaseSetID,
			"SANDBOXWICH_STERILE_POOL_RUNTIME_CLASS="+string(e.Release.RuntimeClass),
			"SANDBOXWICH_STERILE_POOL_POLICY_DIGEST="+e.Release.PolicyDigest,
			"SANDBOXWICH_STERILE_POOL_RELEASE_SIGNATURE="+e.Release.Signature)
		prefix := "SANDBOXWICH_" + strings.ToUpper(strings.ReplaceAll(p.Provider, "-", "_")) + "_"
		for k, v := range p.Settings {
			env = append(env, prefix+strings.ToUpper(k)+"="+v)
		}
	}
	return append(env, s.Extra...)
}

// FreeAddr returns a loopback address with a free port.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Start starts a server on addr ("" picks a free port) and waits until
// /readyz answers 200.
func (e *Env) Start(ctx context.Context, s ServerSpec, addr string) (*Server, error) {
	if addr == "" {
		var err error
		if addr, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	logf, err := os.OpenFile(s.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.Bin, s.Args...)
	cmd.Env = e.environ(s, addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	srv := &Server{URL: "http://" + addr, Addr: addr, cmd: cmd, done: make(chan struct{}), log: logf}
	go func() { _ = cmd.Wait(); close(srv.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-srv.done:
			logf.Close()
			return nil, fmt.Errorf("server exited at start-up (see %s): %s", s.LogFile, tail(s.LogFile))
		case <-ctx.Done():
			srv.Kill()
			return nil, ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
		if ready(srv.URL) {
			return srv, nil
		}
		if time.Now().After(deadline) {
			srv.Kill()
			return nil, fmt.Errorf("server not ready after 60 s (see %s)", s.LogFile)
		}
	}
}

var probe = &http.Client{Timeout: time.Second}

func ready(base string) bool {
	resp, err := probe.Get(base + "/readyz")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// tail returns the last lines of a log file.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], " | ")
}

// Pid returns the server's process ID.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Kill sends SIGKILL to the server's process group and waits for it.
func (s *Server) Kill() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.log.Close()
}

// Stop sends SIGTERM and waits up to grace before SIGKILL.
func (s *Server) Stop(grace time.Duration) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		s.log.Close()
	case <-time.After(grace):
		s.Kill()
	}
}

// Exited reports whether the process has ended.
func (s *Server) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// RSS returns the resident set size of the process in bytes
// (/proc/<pid>/status VmRSS).
func RSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// Postgres is a database created for one run and dropped by Drop.
type Postgres struct {
	Admin string // URL of the maintenance database
	Name  string
	URL   string
}

// CreatePostgres creates a database sbw_rel_<random> on the server of
// adminURL (for example postgres://postgres@127.0.0.1:5432/test?sslmode=disable).
func CreatePostgres(ctx context.Context, adminURL string) (*Postgres, error) {
	db, err := sql.Open("postgres", adminURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	name := "sbw_rel_" + randHex(6)
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("postgres: create database: %w", err)
	}
	u, err := replaceDB(adminURL, name)
	if err != nil {
		return nil, err
	}
	return &Postgres{Admin: adminURL, Name: name, URL: u}, nil
}

// Drop drops the database, closing its remaining connections.
func (p *Postgres) Drop() error {
	db, err := sql.Open("postgres", p.Admin)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = db.ExecContext(ctx, "DROP DATABASE IF EXISTS "+p.Name+" WITH (FORCE)")
	return err
}

func replaceDB(u, name string) (string, error) {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return "", fmt.Errorf("postgres URL %q has no scheme", u)
	}
	hostPart, query, _ := strings.Cut(rest, "?")
	host, _, _ := strings.Cut(hostPart, "/")
	out := scheme + "://" + host + "/" + name
	if query != "" {
		out += "?" + query
	}
	return out, nil
}
