package cloudflare_test

import (
	"errors"
	"net/http"
	"slices"
	"testing"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/cloudflare"
)

// TestReadBackPaths: a proven deployment is read with exactly these
// requests, all reads.
func TestReadBackPaths(t *testing.T) {
	env := startBridge(t)
	api := newFakeAPI(t)
	p := newProvider(t, config(t, env, api, "paths"))
	d, err := p.VerifyDeployment(bg(t))
	if err != nil {
		t.Fatal(err)
	}
	if d.VersionID != "ver-1" || d.DeploymentID != "dep-1" || d.NamespaceID != testNS || d.Image != testImage || d.InstanceType != "basic" {
		t.Fatalf("deployment %+v", d)
	}
	acct := "/client/v4/accounts/" + testAccount
	want := []string{
		"GET " + acct + "/workers/scripts/" + testWorker + "/deployments",
		"GET " + acct + "/workers/workers/" + testWorker + "/versions/ver-1",
		"GET " + acct + "/workers/scripts/" + testWorker + "/settings",
		"GET " + acct + "/workers/durable_objects/namespaces",
		"GET " + acct + "/containers/applications/" + testAppID,
	}
	if got := api.Requests(); !slices.Equal(got, want) {
		t.Fatalf("requests\n%q\nwant\n%q", got, want)
	}
	// Inspect admits the class on the cached read-back: no new request.
	obj := provision(t, p)
	o, err := p.Inspect(bg(t), obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.Verify(obj, o, testClass); err != nil || o.AgentDigest != env.AgentDigest {
		t.Fatalf("Inspect %+v: %v", o, err)
	}
	if n := len(api.Requests()); n != len(want) {
		t.Fatalf("%d requests after Inspect, want the cached read-back", n)
	}
}

// TestReadBackFailsClosed: any disagreement with the configuration, or an
// API that does not answer, leaves the runtime class unadmitted
// (runtime_class_boundary_unverified).
func TestReadBackFailsClosed(t *testing.T) {
	env := startBridge(t)
	for name, mut := range map[string]func(f *fakeAPI){
		"mismatched image digest": func(f *fakeAPI) {
			f.app["configuration"] = map[string]any{"image": "registry.example/sandboxwich-cell@sha256:" + string(make([]byte, 0)) + "0000000000000000000000000000000000000000000000000000000000000000", "instance_type": "basic"}
		},
		"mismatched instance type": func(f *fakeAPI) {
			f.app["configuration"] = map[string]any{"image": testImage, "instance_type": "standard-4"}
		},
		"missing container class": func(f *fakeAPI) { f.versions["ver-1"] = versionJSON("ver-1", "", testImage) },
		"another container class": func(f *fakeAPI) { f.versions["ver-1"] = versionJSON("ver-1", "Other", testImage) },
		"rolled-back deployment": func(f *fakeAPI) {
			// The newest deployment sends all traffic back to an older version
			// that predates the container class.
			f.versions["ver-0"] = versionJSON("ver-0", "", "registry.example/old@sha256:"+"1111111111111111111111111111111111111111111111111111111111111111")
			f.deployments = append([]map[string]any{{"id": "dep-2", "created_on": "2026-12-01T09:00:00Z", "source": "api",
				"strategy": "percentage", "versions": []any{map[string]any{"percentage": 100, "version_id": "ver-0"}}}}, f.deployments...)
		},
		"listed order disagrees": func(f *fakeAPI) {
			f.deployments = append(f.deployments, map[string]any{"id": "dep-0", "created_on": "2026-12-01T09:00:00Z", "source": "api",
				"strategy": "percentage", "versions": []any{map[string]any{"percentage": 100, "version_id": "ver-1"}}})
		},
		"split deployment": func(f *fakeAPI) {
			f.deployments[0]["versions"] = []any{map[string]any{"percentage": 50, "version_id": "ver-1"}, map[string]any{"percentage": 50, "version_id": "ver-0"}}
		},
		"compatibility date": func(f *fakeAPI) { f.versions["ver-1"]["compatibility_date"] = "2025-01-01" },
		"compatibility flags": func(f *fakeAPI) {
			f.settings["compatibility_flags"] = []string{"enable_request_signal", "nodejs_compat"}
		},
		"test-only binding": func(f *fakeAPI) {
			v := f.versions["ver-1"]
			v["bindings"] = append(v["bindings"].([]any), map[string]any{"type": "plain_text", "name": "LOOPBACK_MANAGER", "text": "http://127.0.0.1:1"})
		},
		"binding to another class": func(f *fakeAPI) {
			v := f.versions["ver-1"]
			b := v["bindings"].([]any)
			b[0] = map[string]any{"type": "durable_object_namespace", "name": "CELLS", "class_name": "Registry", "namespace_id": testNS}
		},
		"namespace not sqlite": func(f *fakeAPI) { f.namespaces[1]["use_sqlite"] = false },
		"namespace missing":    func(f *fakeAPI) { f.namespaces = f.namespaces[:1] },
		"application of another namespace": func(f *fakeAPI) {
			f.app["durable_objects"] = map[string]any{"namespace_id": "ns-other"}
		},
		"5xx": func(f *fakeAPI) { f.failStatus, f.failPathPart = http.StatusInternalServerError, "/deployments" },
		"5xx on the application": func(f *fakeAPI) {
			f.failStatus, f.failPathPart = http.StatusBadGateway, "/containers/applications/"
		},
	} {
		t.Run(name, func(t *testing.T) {
			api := newFakeAPI(t)
			api.set(mut)
			p := newProvider(t, config(t, env, api, "closed"))
			_, err := p.VerifyDeployment(bg(t))
			var rbe *cloudflare.ReadBackError
			if !errors.As(err, &rbe) {
				t.Fatalf("VerifyDeployment: %v, want a *ReadBackError", err)
			}
			obj := provision(t, p)
			o, err := p.Inspect(bg(t), obj)
			if err != nil {
				t.Fatal(err)
			}
			var ve *driver.VerifyError
			if o.RuntimeClass != "" || !errors.As(driver.Verify(obj, o, testClass), &ve) {
				t.Fatalf("Inspect admitted %+v", o)
			}
		})
	}
}

// TestReadBackRetries: 429 and 5xx from the API are retried with backoff.
func TestReadBackRetries(t *testing.T) {
	env := startBridge(t)
	for _, st := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		for _, part := range []string{"/deployments", "/containers/applications/"} {
			api := newFakeAPI(t)
			api.set(func(f *fakeAPI) { f.failStatus, f.failCount, f.failPathPart = st, 2, part })
			p := newProvider(t, config(t, env, api, "retry"))
			if _, err := p.VerifyDeployment(bg(t)); err != nil {
				t.Fatalf("HTTP %d twice on %s: %v", st, part, err)
			}
			if n := len(api.Requests()); n != 7 {
				t.Fatalf("HTTP %d on %s: %d requests, want 7 (two retries)", st, part, n)
			}
		}
	}
}

// TestNoReadBack: without a read-back, the class is never admitted.
func TestNoReadBack(t *testing.T) {
	env := startBridge(t)
	cfg := config(t, env, newFakeAPI(t), "none")
	cfg.ReadBack = cloudflare.ReadBack{}
	p := newProvider(t, cfg)
	obj := provision(t, p)
	o, err := p.Inspect(bg(t), obj)
	if err != nil {
		t.Fatal(err)
	}
	if o.RuntimeClass != "" || driver.Verify(obj, o, testClass) == nil {
		t.Fatalf("Inspect without a read-back admitted %+v", o)
	}
}
