package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/postgres"
	"github.com/sandboxwich/sandboxwich/wire"
)

// SkewConfig configures a clock-skew run: two replicas on one PostgreSQL
// database, one clock Skew fast and one Skew slow (the plane's clock
// option), each serving HTTP on loopback.
type SkewConfig struct {
	// Postgres is the admin URL of the server the run's database is made on.
	Postgres string
	Skew     time.Duration
	// Leases is the number of leases, claimed Parallel at a time, each
	// for LeaseSeconds.
	Leases, Parallel int
	LeaseSeconds     uint64
	// Bound is the tolerance the run holds the replicas to: no lease is
	// honoured later than Bound after its expiry, none refused earlier
	// than Bound before it.
	Bound time.Duration
	// Canary is the number of leases of the second run, with the
	// replicas' correction off, which must break the bound.
	Canary int
}

// SkewReport is what a clock-skew run observed.
type SkewReport struct {
	Skew           time.Duration
	Leases, Probes int
	// Offsets are the replicas' measured offsets from the database's clock.
	Offsets [2]time.Duration
	// Late is the longest a lease was still honoured after its expiry
	// (a probe sent that long after it was accepted), Early the longest a
	// lease was refused before it (a probe answered that long before it
	// was refused); zero or negative when none was.
	Late, Early time.Duration
	// CanaryViolations counts the bound's violations of the run without
	// the correction.
	CanaryViolations int
	Violations       []string
}

func (r SkewReport) String() string {
	s := fmt.Sprintf("%d leases, %d probes across 2 replicas with clocks ±%s, measured offsets %s and %s; "+
		"latest acceptance after expiry %s, earliest refusal before it %s; canary without the correction: %d violations",
		r.Leases, r.Probes, r.Skew, r.Offsets[0].Round(time.Millisecond), r.Offsets[1].Round(time.Millisecond),
		max(r.Late, 0).Round(time.Millisecond), max(r.Early, 0).Round(time.Millisecond), r.CanaryViolations)
	if n := len(r.Violations); n > 0 {
		s += fmt.Sprintf("; %d VIOLATIONS: %s", n, strings.Join(r.Violations[:min(n, 5)], "; "))
	}
	return s
}

// Passed reports the verdict: no violation with the correction, and the
// canary without it caught.
func (r SkewReport) Passed() bool {
	return len(r.Violations) == 0 && r.CanaryViolations > 0 && r.Leases > 0
}

// RunSkew runs the check: leases claimed through either replica are
// validated through both every 20 ms until both refuse them, and every
// answer is held against the lease's expiry on the harness's clock — the
// database's, as they share this host. Then the same with the replicas'
// clock correction off, which must be caught.
func RunSkew(ctx context.Context, env *Env, cfg SkewConfig) (SkewReport, error) {
	rep := SkewReport{Skew: cfg.Skew}
	on, err := skewRun(ctx, env, cfg, cfg.Leases, sandboxwich.DefaultClockSyncInterval, &rep)
	if err != nil {
		return rep, err
	}
	rep.Violations = on
	var canary SkewReport
	off, err := skewRun(ctx, env, cfg, cfg.Canary, 0, &canary)
	if err != nil {
		return rep, fmt.Errorf("canary: %w", err)
	}
	rep.CanaryViolations = len(off)
	return rep, nil
}

// skewRun is one run with the clock-sync interval every (0: off).
func skewRun(ctx context.Context, env *Env, cfg SkewConfig, leases int, every time.Duration, rep *SkewReport) ([]string, error) {
	pg, err := CreatePostgres(ctx, cfg.Postgres)
	if err != nil {
		return nil, err
	}
	defer pg.Drop()
	var wg sync.WaitGroup // the planes' Run and the HTTP servers
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	worker := sandboxwich.Worker{ID: env.WorkerID, TenantID: Tenant, RuntimeClasses: []lease.RuntimeClass{env.Release.RuntimeClass}}
	var (
		planes  [2]*sandboxwich.Plane
		clients [2]*client.Client
	)
	for i, skew := range []time.Duration{cfg.Skew, -cfg.Skew} {
		st, err := postgres.Open(ctx, pg.URL, postgres.Options{})
		if err != nil {
			return nil, err
		}
		defer st.Close()
		p, err := sandboxwich.New(st, env.Keys, sandboxwich.WithClock(func() time.Time { return time.Now().Add(skew) }),
			sandboxwich.WithClockSync(every), sandboxwich.WithSweepInterval(50*time.Millisecond),
			sandboxwich.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			return nil, err
		}
		if err := p.SyncClock(ctx); err != nil {
			return nil, err
		}
		rep.Offsets[i], _, _ = p.ClockOffset()
		wg.Go(func() { _ = p.Run(ctx) })
		h, err := httpapi.New(httpapi.Config{Plane: p, Auth: httpapi.Auth{TenantTokens: map[string]string{env.TenantToken: Tenant}},
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		wg.Go(func() { _ = srv.Serve(ln) })
		defer srv.Close()
		if clients[i], err = client.New("http://"+ln.Addr().String(), client.WithToken(env.TenantToken)); err != nil {
			return nil, err
		}
		planes[i] = p
	}

	var (
		mu         sync.Mutex
		violations []string
	)
	violate := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(violations) < 50 {
			violations = append(violations, fmt.Sprintf(format, args...))
		}
	}
	sem := make(chan struct{}, max(cfg.Parallel, 1))
	var leaseWG sync.WaitGroup
	for n := range leases {
		sem <- struct{}{}
		leaseWG.Go(func() {
			defer func() { <-sem }()
			via := n % 2
			_, err := planes[1-via].Prepare(ctx, worker, sandboxwich.PrepareRequest{CellID: uuid.Must(uuid.NewV7()),
				Release: env.Release, ProviderCellID: fmt.Sprintf("skew-%d", n), ExpiresAt: time.Now().Add(time.Hour)})
			if err != nil {
				violate("prepare: %v", err)
				return
			}
			seconds := cfg.LeaseSeconds
			c, err := clients[via].Claim(ctx, wire.ClaimRequest{Release: env.Release, LeaseSeconds: &seconds,
				Binding: lease.Binding{OrganizationID: "org-skew", WorkspaceID: "ws", ThreadID: fmt.Sprintf("t-%d", n), RunnerSessionID: "s"}})
			if err != nil || c.Empty() {
				violate("claim %d through replica %d: %v (empty %v)", n, via, err, err == nil && c.Empty())
				return
			}
			expires := c.Lease.ExpiresAt.Time
			probes, late, early := probeLease(ctx, clients, c, expires, cfg.Bound, violate)
			mu.Lock()
			rep.Leases++
			rep.Probes += probes
			rep.Late, rep.Early = max(rep.Late, late), max(rep.Early, early)
			mu.Unlock()
		})
	}
	leaseWG.Wait()
	return violations, nil
}

// probeLease validates the lease through both replicas every 20 ms until
// both refused it and its expiry is past by twice the bound, holding each
// answer against the expiry: an acceptance sent more than bound after it,
// or a refusal answered more than bound before it, is a violation.
func probeLease(ctx context.Context, clients [2]*client.Client, c client.Claim, expires time.Time, bound time.Duration,
	violate func(string, ...any)) (probes int, late, early time.Duration) {
	late, early = -time.Hour, -time.Hour
	refused := [2]bool{}
	for ctx.Err() == nil && !(refused[0] && refused[1] && time.Since(expires) > 2*bound) {
		if time.Since(expires) > 30*time.Second {
			violate("lease %s still honoured 30 s after its expiry (refused by replica 0: %v, 1: %v)", c.Lease.LeaseID, refused[0], refused[1])
			return probes, late, early
		}
		for i, cl := range clients {
			sent := time.Now()
			_, err := cl.Validate(ctx, c.Lease.LeaseID, c.Proof())
			answered := time.Now()
			probes++
			var ce *client.Error
			switch {
			case err == nil:
				late = max(late, sent.Sub(expires))
				if sent.Sub(expires) > bound {
					violate("lease %s honoured by replica %d %s after its expiry", c.Lease.LeaseID, i, sent.Sub(expires).Round(time.Millisecond))
				}
			case errors.As(err, &ce) && ce.Status == http.StatusConflict:
				refused[i] = true
				early = max(early, expires.Sub(answered))
				if expires.Sub(answered) > bound {
					violate("lease %s refused by replica %d %s before its expiry", c.Lease.LeaseID, i, expires.Sub(answered).Round(time.Millisecond))
				}
			default:
				violate("validate through replica %d: %v", i, err)
				return probes, late, early
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return probes, late, early
}
