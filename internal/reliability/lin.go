package reliability

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// LinConfig configures one recorded run for the linearizability check.
type LinConfig struct {
	Name     string
	Backends []string // server base URLs; the proxy spreads requests over them
	Clients  int
	Duration time.Duration
	// DropRate is the fraction of answers the proxy discards after the
	// server answered.
	DropRate float64
	// Worker makes the harness prepare inventory as an external worker.
	Worker bool
	// Pool says the servers run a dry-run pool of the tenant.
	Pool bool
	// Attempts is the Go client's attempt budget (default 4): small enough
	// that a few operations exhaust it and stay unknown.
	Attempts int
	Seed     uint64
	// Artifacts is where a violation's visualization is written.
	Artifacts string
	// CheckTimeout bounds porcupine (default 3 min).
	CheckTimeout time.Duration
}

// LinReport is the outcome of a run.
type LinReport struct {
	Ops, Unknown, Leased, Empty, Conflicts, Prepared int
	// Renewed counts renewals answered 200, RenewRefused those answered
	// 409 (the lease's stop recorded).
	Renewed, RenewRefused                  int
	Requests, Dropped, FiveXX, ProxyErrors int64
	Partitions                             int
	Result                                 porcupine.CheckResult
	CheckTime                              time.Duration
	Visualization                          string
	// Unexpected lists answers outside the model (e.g. a 400 or a 500).
	Unexpected []string
	// Canary is porcupine's verdict on the same history with one injected
	// violation (a second lease on a cell): it must be Illegal, or the
	// check proves nothing.
	Canary porcupine.CheckResult
	// RenewTwice and RenewShorter are the verdicts on the history with
	// one renewal's answer changed as a broken store would give it: the
	// extension counted twice, and an expiry 30 s short of what the
	// renewal must grant. Both must be Illegal.
	RenewTwice, RenewShorter porcupine.CheckResult
}

// Passed reports whether the run proved what it should.
func (r LinReport) Passed(minDrop float64) bool {
	return r.Result == porcupine.Ok && r.Canary == porcupine.Illegal && r.RenewTwice == porcupine.Illegal &&
		r.RenewShorter == porcupine.Illegal && len(r.Unexpected) == 0 && r.FiveXX == 0 &&
		r.Requests > 0 && float64(r.Dropped) >= minDrop*float64(r.Requests)
}

func (r LinReport) String() string {
	s := fmt.Sprintf("%d ops (%d unknown, %d leased, %d empty, %d conflict, %d prepared, %d renewed, %d renewals refused) in %d partitions, "+
		"%d requests, %d answers dropped (%.1f%%), %d 5xx, porcupine %s in %s (canary %s; renewal canaries: twice %s, shorter %s)",
		r.Ops, r.Unknown, r.Leased, r.Empty, r.Conflicts, r.Prepared, r.Renewed, r.RenewRefused, r.Partitions, r.Requests, r.Dropped,
		100*float64(r.Dropped)/math.Max(1, float64(r.Requests)), r.FiveXX, r.Result, r.CheckTime.Round(time.Millisecond), r.Canary,
		r.RenewTwice, r.RenewShorter)
	if len(r.Unexpected) > 0 {
		s += fmt.Sprintf(", %d unexpected answers (first: %s)", len(r.Unexpected), r.Unexpected[0])
	}
	if r.Visualization != "" {
		s += ", visualization " + r.Visualization
	}
	return s
}

// recorder collects a history.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	bad   []string
}

// pending is the return time of an operation without a definite answer:
// it may still take effect, so it stays open until the end of the history.
const pending = math.MaxInt64

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) add(clientID int, in Input, out Output, call, ret int64) {
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: clientID, Input: in, Output: out, Call: call, Return: ret})
	r.mu.Unlock()
}

func (r *recorder) unexpected(format string, args ...any) {
	r.mu.Lock()
	r.bad = append(r.bad, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// attemptLog counts the HTTP attempts of one operation.
type attemptLog struct{ n, failed atomic.Int32 }

type attemptKey struct{}

// countingTransport records, per operation, attempts whose answer was lost
// or was a 5xx: a later 409 may then follow an effect the client never saw.
type countingTransport struct{ base http.RoundTripper }

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if a, ok := r.Context().Value(attemptKey{}).(*attemptLog); ok {
		a.n.Add(1)
		if err != nil || resp.StatusCode >= 500 {
			a.failed.Add(1)
		}
	}
	return resp, err
}

// linRun is one recorded run.
type linRun struct {
	cfg      LinConfig
	env      *Env
	rec      *recorder
	tenant   *client.Client
	worker   *client.Client // through the proxy
	direct   []*client.Client
	binding  lease.Binding
	stop     atomic.Bool
	hotMu    sync.Mutex
	hot      [8]uuid.UUID
	prepared sync.Map // cell ID → true, set before the prepare is sent
	cells    []uuid.UUID
	cellsMu  sync.Mutex
	leased   atomic.Int64
	seen     sync.Map // lease ID → true
	log      *slog.Logger
}

// RunLinearizability records a history against the servers through a
// dropping proxy and checks it with porcupine.
func RunLinearizability(ctx context.Context, env *Env, cfg LinConfig) (LinReport, error) {
	if cfg.Attempts == 0 {
		cfg.Attempts = 4
	}
	if cfg.CheckTimeout == 0 {
		cfg.CheckTimeout = 3 * time.Minute
	}
	proxy, err := NewDropProxy(cfg.Backends, cfg.DropRate, cfg.Seed)
	if err != nil {
		return LinReport{}, err
	}
	defer proxy.Close()
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second}
	hc := &http.Client{Transport: countingTransport{tr}}
	defer tr.CloseIdleConnections()
	retry := client.WithRetry(cfg.Attempts, 5*time.Millisecond, 100*time.Millisecond)
	w := &linRun{cfg: cfg, env: env, rec: &recorder{start: time.Now()}, log: env.Log,
		binding: lease.Binding{OrganizationID: "org-rel", WorkspaceID: "ws-rel", ThreadID: "thread-rel", RunnerSessionID: "session-rel"}}
	if w.tenant, err = client.New(proxy.URL, client.WithToken(env.TenantToken), client.WithHTTPClient(hc), retry); err != nil {
		return LinReport{}, err
	}
	if w.worker, err = client.New(proxy.URL, client.WithToken(env.WorkerToken), client.WithHTTPClient(hc), retry); err != nil {
		return LinReport{}, err
	}
	for _, b := range cfg.Backends {
		c, err := client.New(b, client.WithToken(env.WorkerToken))
		if err != nil {
			return LinReport{}, err
		}
		w.direct = append(w.direct, c)
	}
	for i := range w.hot {
		w.hot[i] = uuid.Must(uuid.NewV7())
	}

	var wg sync.WaitGroup
	if cfg.Worker {
		for i := range preparers {
			wg.Go(func() { w.preparer(i) })
		}
	}
	for i := range cfg.Clients {
		wg.Go(func() { w.client(i) })
	}
	select {
	case <-time.After(cfg.Duration):
	case <-ctx.Done():
	}
	w.stop.Store(true)
	wg.Wait()

	rep := LinReport{}
	rep.Requests, rep.Dropped, rep.FiveXX, rep.ProxyErrors = proxy.Stats()
	ops := w.rec.ops
	var end int64
	for _, op := range ops {
		if op.Return != pending {
			end = max(end, op.Return)
		}
	}
	for i := range ops {
		out := ops[i].Output.(Output)
		if out.Lease != "" {
			_, out.WorkerCell = w.prepared.Load(out.Cell)
			ops[i].Output = out
		}
		if ops[i].Return == pending {
			ops[i].Return = end + 1
		}
		switch in := ops[i].Input.(Input); {
		case out.Result == Unknown:
			rep.Unknown++
		case in.Kind == Claim && out.Result == OK:
			rep.Leased++
		case in.Kind == Claim && out.Result == Empty:
			rep.Empty++
		case in.Kind == Prepare:
			rep.Prepared++
		case in.Kind == Renew && out.Result == OK:
			rep.Renewed++
		case in.Kind == Renew && out.Result == Conflict:
			rep.RenewRefused++
			rep.Conflicts++
		case out.Result == Conflict:
			rep.Conflicts++
		}
	}
	rep.Ops, rep.Unexpected = len(ops), w.rec.bad
	rep.Partitions = len(partition(ops))
	t0 := time.Now()
	model := Model()
	rep.Result = porcupine.CheckOperationsTimeout(model, ops, cfg.CheckTimeout)
	rep.CheckTime = time.Since(t0)
	if rep.Result != porcupine.Ok {
		rep.Visualization = visualize(model, ops, cfg)
	}
	rep.Canary = canary(model, ops)
	rep.RenewTwice, rep.RenewShorter = renewCanaries(model, ops)
	return rep, nil
}

// visualize writes porcupine's HTML visualization of the partitions that
// are not linearizable (all of them when none is found illegal on its own,
// e.g. after a timeout).
func visualize(model porcupine.Model, ops []porcupine.Operation, cfg LinConfig) string {
	var bad []porcupine.Operation
	var text strings.Builder
	for _, part := range partition(ops) {
		if porcupine.CheckOperationsTimeout(model, part, time.Minute) != porcupine.Ok {
			bad = append(bad, part...)
			text.WriteString("partition:\n")
			sorted := slices.Clone(part)
			slices.SortFunc(sorted, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
			for _, op := range sorted {
				ret := "pending"
				if op.Return != sorted[0].Return || op.Return < math.MaxInt64 {
					ret = fmt.Sprintf("%.6f", float64(op.Return)/1e9)
				}
				fmt.Fprintf(&text, "  client %3d  [%.6f, %s]  %s\n", op.ClientId, float64(op.Call)/1e9, ret,
					describeOperation(op.Input, op.Output))
			}
		}
	}
	_ = os.WriteFile(filepath.Join(cfg.Artifacts, "porcupine-"+cfg.Name+".txt"), []byte(text.String()), 0o600)
	if len(bad) == 0 {
		bad = ops
	}
	_, info := porcupine.CheckOperationsVerbose(model, bad, cfg.CheckTimeout)
	path := filepath.Join(cfg.Artifacts, "porcupine-"+cfg.Name+".html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return "(visualization failed: " + err.Error() + ")"
	}
	return path
}

// canary injects one violation into a copy of the history, a claim that
// returns a cell already leased earlier under another lease, and returns
// porcupine's verdict on it.
func canary(model porcupine.Model, ops []porcupine.Operation) porcupine.CheckResult {
	first := -1
	for i, op := range ops {
		out := op.Output.(Output)
		if op.Input.(Input).Kind != Claim || out.Lease == "" {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		if f := ops[first]; op.Call > f.Return && out.Cell != f.Output.(Output).Cell && out.Lease != f.Output.(Output).Lease {
			mutated := slices.Clone(ops)
			out.Cell, out.WorkerCell = f.Output.(Output).Cell, f.Output.(Output).WorkerCell
			mutated[i].Output = out
			return porcupine.CheckOperationsTimeout(model, mutated, time.Minute)
		}
	}
	return porcupine.Unknown // no two leases to build the canary from
}

// renewCanaries changes the answer of one renewal that asked for the
// maximum lease (a 200 of a few seconds) as a broken store would give it,
// once with the extension counted twice (expiry + lease_seconds) and once
// 30 s short of it, and returns porcupine's verdicts on both histories.
func renewCanaries(model porcupine.Model, ops []porcupine.Operation) (twice, shorter porcupine.CheckResult) {
	for i, op := range ops {
		in, out := op.Input.(Input), op.Output.(Output)
		if in.Kind != Renew || out.Result != OK || out.Expiry == 0 || in.LeaseSeconds < 300 ||
			in.RetWall-in.CallWall > int64(5*time.Second/time.Microsecond) {
			continue
		}
		verdict := func(e int64) porcupine.CheckResult {
			mutated := slices.Clone(ops)
			o := out
			o.Expiry = e
			mutated[i].Output = o
			return porcupine.CheckOperationsTimeout(model, mutated, time.Minute)
		}
		return verdict(out.Expiry + int64(in.LeaseSeconds)*1e6), verdict(out.Expiry - 30e6)
	}
	return porcupine.Unknown, porcupine.Unknown // no renewal to build them from
}

// opCtx returns a context that counts the operation's attempts. It
// outlives the run's deadline so that operations in flight end with a
// definite answer.
func opCtx() (context.Context, context.CancelFunc, *attemptLog) {
	a := &attemptLog{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	return context.WithValue(ctx, attemptKey{}, a), cancel, a
}

// classify maps an error of the client to an answer class. effect marks
// operations that change state: a 409 after an attempt whose answer was
// lost is then Unknown, since the lost attempt may have taken effect.
func (w *linRun) classify(op string, err error, a *attemptLog, effect bool) Result {
	if err == nil {
		return OK
	}
	var ce *client.Error
	if !errors.As(err, &ce) {
		return Unknown // transport errors after every attempt
	}
	switch {
	case ce.Status == http.StatusConflict && ce.Code == errcode.ClaimContended:
		return Unknown
	case ce.Status == http.StatusConflict && effect && a.failed.Load() > 0:
		return Unknown
	case ce.Status == http.StatusConflict:
		return Conflict
	case ce.Status == http.StatusNotFound:
		return NotFound
	case ce.Status >= 500:
		return Unknown
	}
	w.rec.unexpected("%s: %v", op, err)
	return Unknown
}

// retry repeats fn with the same request while its answer is lost, like
// the Go client does for claims (Release and Destroy are not retried by
// the client itself).
func retry(ctx context.Context, attempts int, fn func() error) error {
	var err error
	for i := range attempts {
		if i > 0 {
			time.Sleep(time.Duration(rand.N(20)+5) * time.Millisecond)
		}
		err = fn()
		var ce *client.Error
		if err == nil || ctx.Err() != nil || (errors.As(err, &ce) && ce.Status < 500) {
			return err
		}
	}
	return err
}

// pickClaim chooses a claim ID: mostly fresh, sometimes one shared with
// other clients (identical concurrent and sequential fenced claims), and
// rarely a shared one with a different lease_seconds (a digest mismatch).
func (w *linRun) pickClaim(rng *rand.Rand) (uuid.UUID, uint64) {
	if rng.Float64() >= 0.25 {
		return uuid.Must(uuid.NewV7()), 300
	}
	w.hotMu.Lock()
	defer w.hotMu.Unlock()
	i := rng.IntN(len(w.hot))
	id := w.hot[i]
	if rng.Float64() < 0.3 {
		w.hot[i] = uuid.Must(uuid.NewV7())
	}
	if rng.Float64() < 0.1 {
		return id, 299
	}
	return id, 300
}

func (w *linRun) client(id int) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(id)))
	for !w.stop.Load() {
		claimID, ls := w.pickClaim(rng)
		l, att := w.claim(id, claimID, ls)
		if l != nil {
			w.useLease(id, rng, l, att)
		} else {
			time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
		}
		if w.cfg.Worker && rng.Float64() < 0.02 {
			w.sabotage(id, rng)
		}
	}
}

func (w *linRun) claim(id int, claimID uuid.UUID, ls uint64) (*wire.Lease, string) {
	in := Input{Kind: Claim, ClaimID: claimID.String(), Digest: fmt.Sprintf("ls=%d", ls)}
	ctx, cancel, a := opCtx()
	defer cancel()
	call := w.rec.now()
	in.CallWall = time.Now().UnixMicro()
	c, err := w.tenant.Claim(ctx, wire.ClaimRequest{ClaimID: &claimID, Release: w.env.Release, Binding: w.binding, LeaseSeconds: &ls})
	in.RetWall = time.Now().UnixMicro()
	ret := w.rec.now()
	out := Output{Result: w.classify("claim", err, a, true)}
	switch {
	case out.Result == Unknown && err != nil:
		if _, ok := errors.AsType[*client.Error](err); !ok {
			ret = pending
		}
	case out.Result == OK && c.Empty():
		out.Result = Empty
	case out.Result == OK:
		out.Lease, out.Cell, out.Expiry = c.Lease.LeaseID.String(), c.Lease.CellID.String(), c.Lease.ExpiresAt.UnixMicro()
		if _, dup := w.seen.LoadOrStore(out.Lease, true); !dup {
			w.leased.Add(1)
		}
	}
	w.rec.add(id, in, out, call, ret)
	if out.Result == OK {
		return c.Lease, c.Attestation()
	}
	return nil, ""
}

// simple runs one operation whose answer is its class and, when fn gives
// them, a state and an expiry.
func (w *linRun) simple(id int, in Input, effect bool, fn func(ctx context.Context) (Output, error)) Result {
	ctx, cancel, a := opCtx()
	defer cancel()
	call := w.rec.now()
	in.CallWall = time.Now().UnixMicro()
	got, err := fn(ctx)
	in.RetWall = time.Now().UnixMicro()
	ret := w.rec.now()
	out := Output{Result: w.classify(in.Kind.String(), err, a, effect)}
	if out.Result == Unknown && err != nil {
		if _, ok := errors.AsType[*client.Error](err); !ok {
			ret = pending
		}
	}
	if out.Result == OK {
		out.State, out.Expiry = got.State, got.Expiry
	}
	w.rec.add(id, in, out, call, ret)
	return out.Result
}

func (w *linRun) validate(id int, l *wire.Lease, proof wire.LeaseProof, bad bool) {
	if bad {
		proof.Binding.ThreadID = "thread-other"
	}
	w.simple(id, Input{Kind: Validate, Lease: l.LeaseID.String(), BadProof: bad}, false, func(ctx context.Context) (Output, error) {
		got, err := w.tenant.Validate(ctx, l.LeaseID, proof)
		return Output{Expiry: got.ExpiresAt.UnixMicro()}, err
	})
}

func (w *linRun) status(id int, l *wire.Lease) {
	w.simple(id, Input{Kind: Status, Lease: l.LeaseID.String()}, false, func(ctx context.Context) (Output, error) {
		st, err := w.tenant.Lease(ctx, l.LeaseID)
		return Output{State: string(st.State)}, err
	})
}

func (w *linRun) release(id int, l *wire.Lease, proof wire.LeaseProof, d lease.Disposition) {
	w.simple(id, Input{Kind: Release, Lease: l.LeaseID.String(), Disposition: string(d)}, true, func(ctx context.Context) (Output, error) {
		return Output{}, retry(ctx, w.cfg.Attempts, func() error {
			_, err := w.tenant.Release(ctx, l.LeaseID, proof, d)
			return err
		})
	})
}

func (w *linRun) destroy(id int, cell, leaseID uuid.UUID, d lease.Disposition, wrong bool) {
	in := Input{Kind: Destroy, Cell: cell.String(), Lease: leaseID.String(), Disposition: string(d), WrongLease: wrong}
	w.simple(id, in, true, func(ctx context.Context) (Output, error) {
		var c wire.Cell
		err := retry(ctx, w.cfg.Attempts, func() error {
			var err error
			c, err = w.worker.Destroy(ctx, w.env.WorkerID, cell, wire.DestroyRequest{LeaseID: leaseID, Generation: 2, Disposition: d})
			return err
		})
		return Output{State: string(c.State)}, err
	})
}

// maxLease is the servers' maximum lease length (the default): a
// renewal's lease_seconds is clamped into [1, maxLease].
const maxLease = 300

// renew renews l for ls seconds (clamped as the server clamps them)
// through the Go client, which retries it after a lost answer.
func (w *linRun) renew(id int, l *wire.Lease, proof wire.LeaseProof, ls uint64) {
	in := Input{Kind: Renew, Lease: l.LeaseID.String(), LeaseSeconds: min(max(ls, 1), maxLease)}
	w.simple(id, in, true, func(ctx context.Context) (Output, error) {
		got, err := w.tenant.Renew(ctx, l.LeaseID, proof, ls)
		return Output{Expiry: got.ExpiresAt.UnixMicro()}, err
	})
}

// pickRenewal chooses lease_seconds: mostly the maximum (it extends),
// sometimes less than the lease has left (nothing moves), 0 or huge
// (clamped).
func pickRenewal(rng *rand.Rand) uint64 {
	switch r := rng.Float64(); {
	case r < 0.5:
		return maxLease
	case r < 0.7:
		return 120
	case r < 0.8:
		return 30
	case r < 0.9:
		return 0
	default:
		return 1 << 40
	}
}

func pick[T any](rng *rand.Rand, p float64, a, b T) T {
	if rng.Float64() < p {
		return a
	}
	return b
}

// useLease exercises a lease: validate, status, then end it (release for
// pool cells, the worker's destroy for worker cells) and observe the end.
func (w *linRun) useLease(id int, rng *rand.Rand, l *wire.Lease, att string) {
	proof := wire.LeaseProof{LeaseAttestation: att, Generation: l.Generation, Binding: l.Binding}
	w.validate(id, l, proof, false)
	if rng.Float64() < 0.05 {
		w.validate(id, l, proof, true)
	}
	// Renewals: sometimes two in a row, or a second client's through a
	// shared claim ID, racing the stop below.
	for rng.Float64() < 0.6 {
		w.renew(id, l, proof, pickRenewal(rng))
		if rng.Float64() < 0.5 {
			w.validate(id, l, proof, false)
		}
	}
	w.status(id, l)
	if _, worker := w.prepared.Load(l.CellID.String()); worker {
		if rng.Float64() < 0.2 {
			w.release(id, l, proof, lease.Destroyed) // no membership: 404
		}
		w.destroy(id, l.CellID, l.LeaseID, pick(rng, 0.85, lease.Destroyed, lease.Quarantined), false)
	} else {
		d := pick(rng, 0.9, lease.Destroyed, lease.Quarantined)
		w.release(id, l, proof, d)
		switch r := rng.Float64(); {
		case r < 0.3:
			w.release(id, l, proof, d) // exact retry
		case r < 0.35:
			w.release(id, l, proof, pick(rng, 0.5, lease.Destroyed, lease.Quarantined))
		}
	}
	if rng.Float64() < 0.3 {
		w.renew(id, l, proof, pickRenewal(rng)) // after the stop: 409
	}
	w.validate(id, l, proof, false)
	w.status(id, l)
}

// sabotage sends a destroy with a lease the cell never had: the cell must
// be quarantined, whatever its state.
func (w *linRun) sabotage(id int, rng *rand.Rand) {
	w.cellsMu.Lock()
	if len(w.cells) == 0 {
		w.cellsMu.Unlock()
		return
	}
	cell := w.cells[rng.IntN(len(w.cells))]
	w.cellsMu.Unlock()
	w.destroy(id, cell, uuid.Must(uuid.NewV7()), lease.Quarantined, true)
}

// preparers is the number of goroutines that prepare worker cells.
const preparers = 4

// preparer keeps about 24 unclaimed worker cells in inventory.
func (w *linRun) preparer(p int) {
	n := 0
	clientID := w.cfg.Clients + p
	for !w.stop.Load() {
		w.cellsMu.Lock()
		unclaimed := int64(len(w.cells)) - w.leased.Load()
		w.cellsMu.Unlock()
		if unclaimed >= 24 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		cell := uuid.Must(uuid.NewV7())
		w.prepared.Store(cell.String(), true)
		n++
		req := wire.PrepareRequest{CellID: cell, Release: w.env.Release, ProviderCellID: fmt.Sprintf("w-%d-%d-%d", w.cfg.Seed, p, n),
			ExpiresAt: wire.Time{Time: time.Now().Add(time.Hour)}}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		call := w.rec.now()
		_, err := w.direct[(n+p)%len(w.direct)].Prepare(ctx, w.env.WorkerID, req)
		ret := w.rec.now()
		cancel()
		if err != nil {
			w.prepared.Delete(cell.String())
			w.rec.unexpected("prepare: %v", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		w.rec.add(clientID, Input{Kind: Prepare, Cell: cell.String()}, Output{Result: OK}, call, ret)
		w.cellsMu.Lock()
		w.cells = append(w.cells, cell)
		w.cellsMu.Unlock()
	}
}
