package cloudflare_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/cloudflare"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/lease"
)

const testClass = lease.GVisorLowerRisk

func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// config is a Config for the local bridge env and the fake API.
func config(t testing.TB, env *bridgeEnv, api *fakeAPI, pool string) cloudflare.Config {
	t.Helper()
	return cloudflare.Config{
		BridgeURL: env.URL, BridgeTokenFile: env.TokenFile, Pool: pool, Installation: "inst-test",
		RuntimeClass: testClass, Image: testImage, InstanceType: "basic", AgentDigest: env.AgentDigest,
		ReadBack: cloudflare.ReadBack{
			APIBaseURL: api.BaseURL(), APITokenFile: writeFile(t, "api-token", testAPITok+"\n"),
			AccountID: testAccount, WorkerName: testWorker, ContainerApplicationID: testAppID,
			CompatibilityDate: "2026-04-26", CompatibilityFlags: []string{"enable_request_signal"},
		},
	}
}

func newProvider(t testing.TB, cfg cloudflare.Config) *cloudflare.Provider {
	t.Helper()
	p, err := cloudflare.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cloudflare.SetTestBackend(p, "loopback-test")
	return p
}

func bg(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// harness makes providers over the local workerd bridge, the real agent
// behind it, and the fake Cloudflare API proving the deployment.
type harness struct {
	env *bridgeEnv
	api *fakeAPI
}

func (h harness) MakeProvider(_ context.Context, t *testing.T) (driver.Provider, error) {
	return newProvider(t, config(t, h.env, h.api, "conformance")), nil
}

func (h harness) RuntimeClass() lease.RuntimeClass { return testClass }

// TestConformance runs driver/drivertest against the bridge in a real
// local workerd with the real cell agent behind each Durable Object.
func TestConformance(t *testing.T) {
	env := startBridge(t)
	h := harness{env: env, api: newFakeAPI(t)}
	drivertest.Run(t, h)
	// Every cell the suite made was destroyed with proof: nothing is left.
	p := newProvider(t, config(t, env, h.api, "conformance"))
	left, err := p.List(bg(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("cells left after the suite: %v", left)
	}
	if t.Failed() {
		t.Logf("bridge log:\n%s", env.stderr.String())
	}
}

func provision(t *testing.T, p *cloudflare.Provider) driver.Object {
	t.Helper()
	obj, err := p.Provision(bg(t), driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: testClass})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(context.Background(), obj); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return obj
}

// TestCellLost: a container restart behind the Durable Object ends the
// cell for good — driver.ErrCellLost from the agent connection, not ready
// and no runtime class on Inspect.
func TestCellLost(t *testing.T) {
	env := startBridge(t)
	p := newProvider(t, config(t, env, newFakeAPI(t), "lost"))
	obj := provision(t, p)
	c, err := p.Agent(bg(t), obj)
	if err != nil {
		t.Fatal(err)
	}
	act := agent.Activation{Version: 1, Fence: agent.Fence{CellID: obj.CellID.String(), LeaseID: uuid.NewString(), Generation: 1},
		ExpiresAt: time.Now().Add(time.Hour).UTC(), TTLMillis: time.Hour.Milliseconds()}
	if err := c.Activate(bg(t), act); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(env.Manager+"/containers/"+obj.CellID.String()+"/restart", "application/json", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("restart: %v %v", resp, err)
	}
	resp.Body.Close()
	_, err = c.Exec(bg(t), agent.ExecRequest{Fence: act.Fence, Activation: &act, Argv: []string{"true"}}, nil)
	if !errors.Is(err, driver.ErrCellLost) {
		t.Fatalf("Exec after a restart: %v, want ErrCellLost", err)
	}
	if _, err := p.Agent(bg(t), obj); !errors.Is(err, driver.ErrCellLost) {
		t.Fatalf("Agent after a restart: %v, want ErrCellLost", err)
	}
	o, err := p.Inspect(bg(t), obj)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Exists || o.Ready || o.RuntimeClass != "" || driver.Verify(obj, o, testClass) == nil {
		t.Fatalf("Inspect after a restart: %+v", o)
	}
}

// TestTokens: a wrong bridge or API token is a terminal ErrUnauthorized,
// asked once, and no token appears in any error.
func TestTokens(t *testing.T) {
	env := startBridge(t)
	api := newFakeAPI(t)
	cfg := config(t, env, api, "tokens")
	wrong := "wrong-token-0000000000000000000000000000000000"
	cfg.BridgeTokenFile = writeFile(t, "bad-bridge", wrong)
	p := newProvider(t, cfg)
	_, err := p.Provision(bg(t), driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: testClass})
	if !errors.Is(err, cloudflare.ErrUnauthorized) {
		t.Fatalf("Provision with a wrong bridge token: %v, want ErrUnauthorized", err)
	}
	if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), testToken) {
		t.Fatalf("the error names a token: %v", err)
	}
	_, err = p.Agent(bg(t), driver.Object{CellID: uuid.Must(uuid.NewV7())})
	if !errors.Is(err, cloudflare.ErrUnauthorized) {
		t.Fatalf("Agent with a wrong bridge token: %v", err)
	}

	cfg = config(t, env, api, "tokens")
	cfg.ReadBack.APITokenFile = writeFile(t, "bad-api", "wrong-api-token")
	p = newProvider(t, cfg)
	before := len(api.Requests())
	_, err = p.VerifyDeployment(bg(t))
	if !errors.Is(err, cloudflare.ErrUnauthorized) {
		t.Fatalf("VerifyDeployment with a wrong API token: %v, want ErrUnauthorized", err)
	}
	if n := len(api.Requests()) - before; n != 1 {
		t.Fatalf("a 401 was asked %d times, want once (terminal)", n)
	}
	if strings.Contains(err.Error(), "wrong-api-token") || strings.Contains(err.Error(), testAPITok) {
		t.Fatalf("the error names a token: %v", err)
	}
}

// faultProxy is a reverse proxy in front of the real bridge that answers
// the first n requests with status: faults the real bridge cannot make on
// demand.
func faultProxy(t *testing.T, target string, status int, n int32) (*httptest.Server, *atomic.Int32) {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	var left atomic.Int32
	left.Store(n)
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		if left.Add(-1) >= 0 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, `{"code":"internal","message":"injected"}`, status)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

// TestBridgeRetries: 429 and 5xx from the bridge are retried with backoff;
// a bridge that does not answer makes Destroy uncertain.
func TestBridgeRetries(t *testing.T) {
	env := startBridge(t)
	api := newFakeAPI(t)
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		srv, seen := faultProxy(t, env.URL, status, 2)
		cfg := config(t, env, api, "retries")
		cfg.BridgeURL = srv.URL
		p := newProvider(t, cfg)
		obj := provision(t, p)
		if seen.Load() < 3 {
			t.Fatalf("HTTP %d: %d requests, want the create retried", status, seen.Load())
		}
		o, err := p.Inspect(bg(t), obj)
		if err != nil || driver.Verify(obj, o, testClass) != nil {
			t.Fatalf("Inspect: %+v %v", o, err)
		}
	}

	srv, _ := faultProxy(t, env.URL, http.StatusBadGateway, 0)
	cfg := config(t, env, api, "retries")
	cfg.BridgeURL = srv.URL
	p := newProvider(t, cfg)
	obj, err := p.Provision(bg(t), driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: testClass})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	err = p.Destroy(bg(t), obj)
	if !errors.Is(err, driver.ErrUncertain) {
		t.Fatalf("Destroy through a closed bridge: %v, want ErrUncertain", err)
	}
	// Through the real bridge, the deletion is proven.
	p2 := newProvider(t, config(t, env, api, "retries"))
	if err := p2.Destroy(bg(t), obj); err != nil {
		t.Fatal(err)
	}
	if o, err := p2.Inspect(bg(t), obj); err != nil || o.Exists {
		t.Fatalf("Inspect after Destroy: %+v %v", o, err)
	}
}

// TestNew refuses configurations that could not be verified.
func TestNew(t *testing.T) {
	tok := writeFile(t, "tok", testToken)
	good := cloudflare.Config{BridgeURL: "https://bridge.example", BridgeTokenFile: tok, Pool: "p", RuntimeClass: testClass,
		Image: testImage, InstanceType: "basic", AgentDigest: "sha256:" + strings.Repeat("d", 64)}
	if _, err := cloudflare.New(good); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*cloudflare.Config){
		"no runtime class":      func(c *cloudflare.Config) { c.RuntimeClass = "" },
		"unknown runtime class": func(c *cloudflare.Config) { c.RuntimeClass = "cloudflare" },
		"image by tag":          func(c *cloudflare.Config) { c.Image = "registry.example/cell:latest" },
		"no instance type":      func(c *cloudflare.Config) { c.InstanceType = "" },
		"bad agent digest":      func(c *cloudflare.Config) { c.AgentDigest = "abc" },
		"plain http":            func(c *cloudflare.Config) { c.BridgeURL = "http://bridge.example" },
		"bridge path":           func(c *cloudflare.Config) { c.BridgeURL = "https://bridge.example/x" },
		"no token file":         func(c *cloudflare.Config) { c.BridgeTokenFile = "" },
		"missing token file":    func(c *cloudflare.Config) { c.BridgeTokenFile = tok + ".missing" },
		"read-back half-set":    func(c *cloudflare.Config) { c.ReadBack.AccountID = testAccount },
		"read-back plain http": func(c *cloudflare.Config) {
			c.ReadBack = cloudflare.ReadBack{APIBaseURL: "http://api.example", APITokenFile: tok, AccountID: "a", WorkerName: "w", ContainerApplicationID: "x", CompatibilityDate: "2026-04-26"}
		},
	} {
		c := good
		mut(&c)
		if _, err := cloudflare.New(c); err == nil {
			t.Errorf("%s: New accepted %+v", name, c)
		} else if strings.Contains(err.Error(), testToken) {
			t.Errorf("%s: the error names the token: %v", name, err)
		}
	}
}

// TestConfigFromSettings maps the SANDBOXWICH_CLOUDFLARE_* keys and
// refuses unknown and missing ones.
func TestConfigFromSettings(t *testing.T) {
	s := map[string]string{"bridge_url": "https://b.example", "bridge_token_file": "/t", "runtime_class": "gvisor_lower_risk",
		"image": testImage, "instance_type": "basic", "agent_digest": "sha256:" + strings.Repeat("e", 64),
		"api_token_file": "/a", "account_id": testAccount, "worker_name": testWorker, "container_application_id": testAppID,
		"compatibility_date": "2026-04-26", "compatibility_flags": "nodejs_compat, no_x", "read_back_interval_ms": "60000"}
	cfg, err := cloudflare.ConfigFromSettings("pool-a", s)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RuntimeClass != lease.GVisorLowerRisk || cfg.ReadBack.Interval != time.Minute ||
		strings.Join(cfg.ReadBack.CompatibilityFlags, ",") != "nodejs_compat,no_x" || cfg.Pool != "pool-a" {
		t.Fatalf("%+v", cfg)
	}
	s["typo"] = "x"
	if _, err := cloudflare.ConfigFromSettings("p", s); err == nil || !strings.Contains(err.Error(), "typo") {
		t.Fatalf("unknown key: %v", err)
	}
	delete(s, "typo")
	delete(s, "runtime_class")
	if _, err := cloudflare.ConfigFromSettings("p", s); err == nil || !strings.Contains(err.Error(), "runtime_class") {
		t.Fatalf("missing runtime_class: %v", err)
	}
}
