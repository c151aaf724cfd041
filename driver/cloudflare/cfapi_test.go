package cloudflare_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// The fake Cloudflare API: a loopback server of exactly the subset of the
// API the read-back calls, recording every request so the tests can
// assert the paths and queries.
const (
	testAccount = "0123456789abcdef0123456789abcdef"
	testWorker  = "sandboxwich-bridge"
	testAppID   = "a1b2c3d4-0000-4000-8000-000000000001"
	testNS      = "ns0123456789"
	testAPITok  = "api-token-fedcba9876543210fedcba9876543210"
)

type fakeAPI struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []string // "METHOD path?query"
	badAuth  int

	// What the API answers; tests change them.
	deployments  []map[string]any
	versions     map[string]map[string]any
	settings     map[string]any
	namespaces   []map[string]any
	app          map[string]any
	failStatus   int // answer every request with this status (0: no)
	failCount    int // …this many times (0: always)
	failPathPart string
}

func versionJSON(id, class, image string) map[string]any {
	bindings := []any{
		map[string]any{"type": "durable_object_namespace", "name": "CELLS", "class_name": "CellObject", "namespace_id": testNS},
		map[string]any{"type": "durable_object_namespace", "name": "REGISTRY", "class_name": "Registry", "namespace_id": "ns-registry"},
		map[string]any{"type": "plain_text", "name": "CELL_IMAGE", "text": image},
		map[string]any{"type": "plain_text", "name": "CELL_INSTANCE_TYPE", "text": "basic"},
		map[string]any{"type": "plain_text", "name": "CONTAINER_CLASS", "text": "CellObject"},
		map[string]any{"type": "secret_text", "name": "BRIDGE_TOKEN"},
	}
	v := map[string]any{"id": id, "number": 1, "created_on": "2026-11-30T10:00:00Z", "urls": []string{},
		"bindings": bindings, "compatibility_date": "2026-04-26", "compatibility_flags": []string{"enable_request_signal"}}
	if class != "" {
		v["containers"] = []any{map[string]any{"class_name": class}}
	}
	return v
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{
		deployments: []map[string]any{
			{"id": "dep-1", "created_on": "2026-11-30T10:00:00Z", "source": "wrangler", "strategy": "percentage",
				"versions": []any{map[string]any{"percentage": 100, "version_id": "ver-1"}}},
		},
		versions: map[string]map[string]any{"ver-1": versionJSON("ver-1", "CellObject", testImage)},
		settings: map[string]any{"compatibility_date": "2026-04-26", "compatibility_flags": []string{"enable_request_signal"}, "bindings": []any{}},
		namespaces: []map[string]any{
			{"id": "ns-other", "class": "Other", "name": "other_Other", "script": "other", "use_sqlite": false},
			{"id": testNS, "class": "CellObject", "name": testWorker + "_CellObject", "script": testWorker, "use_sqlite": true},
		},
		app: map[string]any{"id": testAppID, "account_id": testAccount, "name": testWorker + "-cellobject",
			"scheduling_policy": "default", "instances": 0, "max_instances": 50,
			"configuration":   map[string]any{"image": testImage, "instance_type": "basic", "vcpu": 0.25, "memory_mib": 1024},
			"durable_objects": map[string]any{"namespace_id": testNS}},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// BaseURL is the API's base URL, as in api_base_url.
func (f *fakeAPI) BaseURL() string { return f.srv.URL + "/client/v4" }

func (f *fakeAPI) Requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func (f *fakeAPI) set(fn func(f *fakeAPI)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func envelope(w http.ResponseWriter, result any, extra map[string]any) {
	m := map[string]any{"success": true, "errors": []any{}, "messages": []any{}, "result": result}
	for k, v := range extra {
		m[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(m)
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.URL.RequestURI())
	if r.Header.Get("Authorization") != "Bearer "+testAPITok {
		f.badAuth++
		f.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"success":false,"errors":[{"code":10000,"message":"Authentication error"}],"messages":[],"result":null}`))
		return
	}
	if f.failStatus != 0 && strings.Contains(r.URL.Path, f.failPathPart) {
		status := f.failStatus
		if f.failCount > 0 {
			f.failCount--
			if f.failCount == 0 {
				f.failStatus = 0
			}
		}
		f.mu.Unlock()
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"success":false,"errors":[{"code":10013,"message":"failure"}],"messages":[],"result":null}`))
		return
	}
	defer f.mu.Unlock()
	if r.Method != http.MethodGet {
		http.Error(w, "read-only", http.StatusMethodNotAllowed)
		return
	}
	p := strings.TrimPrefix(r.URL.Path, "/client/v4")
	acct := "/accounts/" + testAccount
	switch {
	case p == acct+"/workers/scripts/"+testWorker+"/deployments":
		envelope(w, map[string]any{"deployments": f.deployments}, nil)
	case strings.HasPrefix(p, acct+"/workers/workers/"+testWorker+"/versions/"):
		v, ok := f.versions[strings.TrimPrefix(p, acct+"/workers/workers/"+testWorker+"/versions/")]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"success":false,"errors":[{"code":10007,"message":"not found"}],"messages":[],"result":null}`))
			return
		}
		envelope(w, v, nil)
	case p == acct+"/workers/scripts/"+testWorker+"/settings":
		envelope(w, f.settings, nil)
	case p == acct+"/workers/durable_objects/namespaces":
		page := r.URL.Query().Get("page")
		if page != "" && page != "1" {
			envelope(w, []any{}, map[string]any{"result_info": map[string]any{"page": 2, "per_page": 20, "count": 0, "total_count": len(f.namespaces)}})
			return
		}
		envelope(w, f.namespaces, map[string]any{"result_info": map[string]any{"page": 1, "per_page": 20, "count": len(f.namespaces), "total_count": len(f.namespaces)}})
	case p == acct+"/containers/applications/"+testAppID:
		envelope(w, f.app, nil)
	default:
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"success":false,"errors":[{"code":7003,"message":"no route"}],"messages":[],"result":null}`))
	}
}
