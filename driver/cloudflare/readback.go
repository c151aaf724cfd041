package cloudflare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/durable_objects"
	"github.com/cloudflare/cloudflare-go/v6/option"
	"github.com/cloudflare/cloudflare-go/v6/workers"
)

// DefaultAPIBaseURL is the Cloudflare API the read-back asks.
const DefaultAPIBaseURL = "https://api.cloudflare.com/client/v4"

// DefaultReadBackInterval is how old a read-back may be before the next
// Inspect makes a new one.
const DefaultReadBackInterval = 5 * time.Minute

// ReadBack configures the verification of the deployed bridge through the
// Cloudflare API (read-only; CONTRACT §18). Every field but APIBaseURL,
// DurableObjectBinding, Interval and HTTPClient is required.
type ReadBack struct {
	// APIBaseURL is the API's base URL; "" means DefaultAPIBaseURL.
	APIBaseURL string
	// APITokenFile holds the API token (read-only permissions, see the
	// package README); it is read for every read-back.
	APITokenFile string
	// AccountID is the account of the Worker and the container application.
	AccountID string
	// WorkerName is the bridge Worker's script name (wrangler's "name").
	WorkerName string
	// WorkerID is the Worker's ID for the Workers (beta) API that reads a
	// version; "" means WorkerName.
	WorkerID string
	// ContainerApplicationID is the container application's ID
	// (`wrangler containers list`).
	ContainerApplicationID string
	// DurableObjectBinding is the cells' Durable Object binding; "" means
	// "CELLS".
	DurableObjectBinding string
	// CompatibilityDate and CompatibilityFlags are the Worker's
	// compatibility settings as deployed (flags in any order).
	CompatibilityDate  string
	CompatibilityFlags []string
	// Interval bounds the age of the read-back the runtime class is
	// admitted on; zero means DefaultReadBackInterval.
	Interval time.Duration
	// HTTPClient carries the API requests; nil means a default client.
	HTTPClient *http.Client
}

// Deployment is what a successful read-back proved.
type Deployment struct {
	DeploymentID string
	VersionID    string
	NamespaceID  string
	Image        string
	InstanceType string
	VerifiedAt   time.Time
}

// ReadBackError is a read-back that did not prove the configured
// deployment: the runtime class is then not admitted
// (runtime_class_boundary_unverified).
type ReadBackError struct{ Reason string }

// Error describes what the read-back did not prove.
func (e *ReadBackError) Error() string { return "cloudflare read-back: " + e.Reason }

func mismatch(format string, args ...any) error {
	return &ReadBackError{Reason: fmt.Sprintf(format, args...)}
}

// digestRef matches an image reference pinned by digest.
var digestRef = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)

// readBack performs and caches read-backs.
type readBack struct {
	cfg      ReadBack
	expected expectation
	hc       *http.Client

	mu   sync.Mutex
	last Deployment
	err  error
	at   time.Time
}

// expectation is what the read-back must find, from the driver's
// configuration.
type expectation struct {
	containerClass string
	image          string
	instanceType   string
}

func newReadBack(cfg ReadBack, exp expectation) (*readBack, error) {
	var missing []string
	for k, v := range map[string]string{"api_token_file": cfg.APITokenFile, "account_id": cfg.AccountID,
		"worker_name": cfg.WorkerName, "container_application_id": cfg.ContainerApplicationID,
		"compatibility_date": cfg.CompatibilityDate} {
		if v == "" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("cloudflare: the read-back needs %s", strings.Join(missing, ", "))
	}
	if cfg.APIBaseURL == "" {
		cfg.APIBaseURL = DefaultAPIBaseURL
	}
	if u, err := url.Parse(cfg.APIBaseURL); err != nil || u.Host == "" ||
		(u.Scheme != "https" && !(u.Scheme == "http" && isLoopback(u.Hostname()))) {
		return nil, fmt.Errorf("cloudflare: api_base_url %q is not an https URL", cfg.APIBaseURL)
	}
	cfg.APIBaseURL = strings.TrimSuffix(cfg.APIBaseURL, "/")
	if cfg.DurableObjectBinding == "" {
		cfg.DurableObjectBinding = "CELLS"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultReadBackInterval
	}
	if _, err := readToken(cfg.APITokenFile); err != nil {
		return nil, err
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &readBack{cfg: cfg, expected: exp, hc: hc}, nil
}

// current returns the cached read-back when it is younger than the
// interval, else makes a new one. A failed read-back is cached as well,
// for a tenth of the interval, so a failing API is not hammered.
func (r *readBack) current(ctx context.Context, now time.Time) (Deployment, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ttl := r.cfg.Interval
	if r.err != nil {
		ttl /= 10
	}
	if !r.at.IsZero() && now.Sub(r.at) < ttl {
		return r.last, r.err
	}
	d, err := r.verify(ctx)
	if ctx.Err() != nil && err != nil {
		return Deployment{}, err // the caller gave up: cache nothing
	}
	r.last, r.err, r.at = d, err, now
	return d, err
}

// statusRecorder is a cloudflare-go middleware that remembers whether the
// API refused the token, so 401/403 is told apart as ErrUnauthorized.
type statusRecorder struct {
	mu     sync.Mutex
	denied bool
}

func (s *statusRecorder) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	resp, err := next(req)
	if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
		s.mu.Lock()
		s.denied = true
		s.mu.Unlock()
	}
	return resp, err
}

func (s *statusRecorder) wrap(what string, err error) error {
	s.mu.Lock()
	denied := s.denied
	s.mu.Unlock()
	if denied {
		return fmt.Errorf("cloudflare read-back: %s: %w", what, ErrUnauthorized)
	}
	return &ReadBackError{Reason: what + ": " + err.Error()}
}

// verify reads the deployment back and compares it with the
// configuration. Every call is a read; nothing is changed.
func (r *readBack) verify(ctx context.Context) (Deployment, error) {
	tok, err := readToken(r.cfg.APITokenFile)
	if err != nil {
		return Deployment{}, err
	}
	rec := &statusRecorder{}
	opts := []option.RequestOption{
		option.WithAPIToken(tok),
		option.WithBaseURL(r.cfg.APIBaseURL + "/"),
		option.WithHTTPClient(r.hc),
		option.WithMaxRetries(4), // 429 and 5xx, with the SDK's backoff
		option.WithMiddleware(rec.middleware),
	}
	account := r.cfg.AccountID
	worker := r.cfg.WorkerName

	// 1. Which version is live: the newest deployment, all traffic on one version.
	var depQ workers.ScriptDeploymentListParams
	depQ.AccountID.Value, depQ.AccountID.Present = account, true
	deps, err := workers.NewScriptDeploymentService(opts...).List(ctx, worker, depQ)
	if err != nil {
		return Deployment{}, rec.wrap("listing the Worker's deployments", err)
	}
	if len(deps.Deployments) == 0 {
		return Deployment{}, mismatch("the Worker %s has no deployment", worker)
	}
	// The API lists the deployment serving traffic first; a list whose
	// creation times disagree with that order proves nothing.
	live := deps.Deployments[0]
	for _, d := range deps.Deployments[1:] {
		if d.CreatedOn.After(live.CreatedOn) {
			return Deployment{}, mismatch("deployment %s is listed first but %s is newer", live.ID, d.ID)
		}
	}
	if len(live.Versions) != 1 || live.Versions[0].Percentage != 100 {
		return Deployment{}, mismatch("deployment %s splits traffic over %d versions: every version would need proving", live.ID, len(live.Versions))
	}
	versionID := live.Versions[0].VersionID

	// 2. The live version: its container class, Durable Object binding, variables and compatibility settings.
	var verQ workers.BetaWorkerVersionGetParams
	verQ.AccountID.Value, verQ.AccountID.Present = account, true
	workerID := r.cfg.WorkerID
	if workerID == "" {
		workerID = worker
	}
	v, err := workers.NewBetaWorkerVersionService(opts...).Get(ctx, workerID, versionID, verQ)
	if err != nil {
		return Deployment{}, rec.wrap("reading the live version", err)
	}
	exp := r.expected
	if !slices.ContainsFunc(v.Containers, func(c workers.VersionContainer) bool { return c.ClassName == exp.containerClass }) {
		return Deployment{}, mismatch("live version %s has no container class %s", versionID, exp.containerClass)
	}
	var nsID string
	vars := map[string]string{}
	for _, b := range v.Bindings {
		switch b.Type {
		case workers.VersionBindingsTypeDurableObjectNamespace:
			if b.Name == r.cfg.DurableObjectBinding {
				if b.ClassName != exp.containerClass || (b.ScriptName != "" && b.ScriptName != worker) {
					return Deployment{}, mismatch("binding %s names class %q of script %q, not %s", b.Name, b.ClassName, b.ScriptName, exp.containerClass)
				}
				nsID = b.NamespaceID
			}
		case workers.VersionBindingsTypePlainText:
			vars[b.Name] = b.Text
		}
		if b.Name == "LOOPBACK_MANAGER" {
			return Deployment{}, mismatch("live version %s has the test-only binding LOOPBACK_MANAGER", versionID)
		}
	}
	if nsID == "" {
		return Deployment{}, mismatch("live version %s has no Durable Object binding %s", versionID, r.cfg.DurableObjectBinding)
	}
	for name, want := range map[string]string{"CELL_IMAGE": exp.image, "CELL_INSTANCE_TYPE": exp.instanceType, "CONTAINER_CLASS": exp.containerClass} {
		if vars[name] != want {
			return Deployment{}, mismatch("live version %s has %s = %q, not %q", versionID, name, vars[name], want)
		}
	}
	if err := r.compat("live version "+versionID, v.CompatibilityDate, v.CompatibilityFlags); err != nil {
		return Deployment{}, err
	}

	// 3. The script's settings (what the next deployment inherits) agree.
	var setQ workers.ScriptScriptAndVersionSettingGetParams
	setQ.AccountID.Value, setQ.AccountID.Present = account, true
	st, err := workers.NewScriptScriptAndVersionSettingService(opts...).Get(ctx, worker, setQ)
	if err != nil {
		return Deployment{}, rec.wrap("reading the script's settings", err)
	}
	if err := r.compat("the script's settings", st.CompatibilityDate, st.CompatibilityFlags); err != nil {
		return Deployment{}, err
	}

	// 4. The namespace the binding names belongs to the Worker's class and stores in SQLite.
	var found *durable_objects.Namespace
	var nsQ durable_objects.NamespaceListParams
	nsQ.AccountID.Value, nsQ.AccountID.Present = account, true
	pager := durable_objects.NewNamespaceService(opts...).ListAutoPaging(ctx, nsQ)
	for pager.Next() {
		ns := pager.Current()
		if ns.ID == nsID {
			found = &ns
			break
		}
	}
	if err := pager.Err(); err != nil {
		return Deployment{}, rec.wrap("listing Durable Object namespaces", err)
	}
	if found == nil {
		return Deployment{}, mismatch("no Durable Object namespace %s in the account", nsID)
	}
	if found.Script != worker || found.Class != exp.containerClass || !found.UseSqlite {
		return Deployment{}, mismatch("namespace %s is class %q of script %q (sqlite %v), not %s of %s", nsID, found.Class, found.Script, found.UseSqlite, exp.containerClass, worker)
	}

	// 5. The container application: image digest, instance type, and the namespace it serves.
	app, err := r.application(ctx, tok)
	if err != nil {
		return Deployment{}, err
	}
	if app.Configuration.Image != exp.image {
		return Deployment{}, mismatch("container application %s runs image %q, not %q", app.ID, app.Configuration.Image, exp.image)
	}
	if app.Configuration.InstanceType != exp.instanceType {
		return Deployment{}, mismatch("container application %s has instance type %q, not %q", app.ID, app.Configuration.InstanceType, exp.instanceType)
	}
	if app.DurableObjects.NamespaceID != nsID {
		return Deployment{}, mismatch("container application %s serves namespace %q, not %s", app.ID, app.DurableObjects.NamespaceID, nsID)
	}
	return Deployment{DeploymentID: live.ID, VersionID: versionID, NamespaceID: nsID, Image: exp.image,
		InstanceType: exp.instanceType, VerifiedAt: time.Now()}, nil
}

func (r *readBack) compat(what, date string, flags []string) error {
	if date != r.cfg.CompatibilityDate {
		return mismatch("%s: compatibility date %q, not %q", what, date, r.cfg.CompatibilityDate)
	}
	got, want := slices.Clone(flags), slices.Clone(r.cfg.CompatibilityFlags)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return mismatch("%s: compatibility flags %q, not %q", what, got, want)
	}
	return nil
}

// application is the part of a container application the read-back
// compares.
type application struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	Configuration struct {
		Image        string `json:"image"`
		InstanceType string `json:"instance_type"`
	} `json:"configuration"`
	DurableObjects struct {
		NamespaceID string `json:"namespace_id"`
	} `json:"durable_objects"`
}

// application reads GET /accounts/{a}/containers/applications/{id}.
// cloudflare-go v6 has no containers package, and its root client's
// generic Get would link every one of its 117 packages into the plane, so
// this one read is a plain GET with the same token, the same
// retries (429 and 5xx, with backoff) and the same envelope.
func (r *readBack) application(ctx context.Context, tok string) (application, error) {
	path := fmt.Sprintf("/accounts/%s/containers/applications/%s", url.PathEscape(r.cfg.AccountID), url.PathEscape(r.cfg.ContainerApplicationID))
	delay := 250 * time.Millisecond
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.cfg.APIBaseURL+path, nil)
		if err != nil {
			return application{}, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Accept", "application/json")
		resp, err := r.hc.Do(req)
		if err != nil {
			return application{}, &ReadBackError{Reason: "reading the container application: " + scrub(err).Error()}
		}
		switch {
		case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
			drain(resp)
			return application{}, fmt.Errorf("cloudflare read-back: reading the container application: %w", ErrUnauthorized)
		case (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500) && attempt < 4:
			wait := delay + rand.N(delay/2+1)
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && s <= 60 {
				wait = time.Duration(s) * time.Second
			}
			drain(resp)
			select {
			case <-ctx.Done():
				return application{}, ctx.Err()
			case <-time.After(wait):
			}
			delay *= 2
			continue
		case resp.StatusCode != http.StatusOK:
			drain(resp)
			return application{}, mismatch("reading the container application: HTTP %d", resp.StatusCode)
		}
		var env struct {
			Success bool            `json:"success"`
			Result  json.RawMessage `json:"result"`
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			return application{}, &ReadBackError{Reason: "reading the container application: " + err.Error()}
		}
		var app application
		if err := json.Unmarshal(b, &env); err != nil || !env.Success || json.Unmarshal(env.Result, &app) != nil {
			return application{}, mismatch("the container application's answer is not a successful API envelope")
		}
		if app.ID != r.cfg.ContainerApplicationID {
			return application{}, mismatch("the API answered application %q for %q", app.ID, r.cfg.ContainerApplicationID)
		}
		return app, nil
	}
}

// errReadBackOff marks a provider configured without a read-back.
var errReadBackOff = errors.New("no read-back is configured")
