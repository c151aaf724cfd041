package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/postgres"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/webhook"
)

// openStore opens the store named by a database URL.
func openStore(ctx context.Context, url string, migrate bool) (store.Store, error) {
	switch {
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		return postgres.Open(ctx, url, postgres.Options{SkipMigrate: !migrate})
	case strings.HasPrefix(url, "sqlite://"):
		path := strings.TrimPrefix(url, "sqlite://")
		if path == "" || path == "/" {
			return nil, errors.New("invalid SANDBOXWICH_DATABASE_URL: sqlite:// needs a path")
		}
		return sqlite.Open(ctx, path, sqlite.Options{SkipMigrate: !migrate})
	}
	return nil, errors.New("invalid SANDBOXWICH_DATABASE_URL: must start with sqlite:// or postgres://")
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("invalid SANDBOXWICH_LOG_LEVEL: %q", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

func migrate(ctx context.Context, e env, args []string) error {
	c, err := loadConfig(e, "migrate", args)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, c.DatabaseURL, true)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Ping(ctx); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "sandboxwich: database migrated")
	return nil
}

// server is everything serve runs, built from a config.
type server struct {
	cfg     *config
	log     *slog.Logger
	store   store.Store
	plane   *sandboxwich.Plane
	handler http.Handler
	// endStreams ends the event streams, which never finish by
	// themselves, when the server shuts down.
	endStreams func()
	// webhooks delivers the event log to the configured endpoints.
	webhooks *webhook.Deliverer
	// drainTimeout, when positive, makes run end every pool cell, leased
	// ones included, with proof, within that time before exiting (dev); a
	// server otherwise keeps its cells for its restart, which reconciles
	// them.
	drainTimeout time.Duration
	// drained, when set, runs after a drain that ended every cell.
	drained func()
	// egress is the egress net of the gvisor pools with an allow-list,
	// nil without one.
	egress *gvisor.EgressNet
}

// build opens the store, builds pools and the plane, and the HTTP handler.
// It refuses to start on any invalid setting, naming it.
func build(ctx context.Context, c *config, log *slog.Logger) (*server, error) {
	if c.SigningKeyFile == "" {
		return nil, errors.New("SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE is required (a file holding ≥ 32 bytes, mode 0600)")
	}
	keys, err := attest.LoadKeyFile(c.SigningKeyFile)
	if err != nil {
		return nil, fmt.Errorf("invalid SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE: %w", err)
	}
	st, err := openStore(ctx, c.DatabaseURL, c.AutoMigrate)
	if err != nil {
		return nil, err
	}
	egressNet, err := startEgressNet(ctx, st, c.Pools, log)
	if err != nil {
		st.Close()
		return nil, err
	}
	var pools []pool.Config
	for _, p := range c.Pools {
		if p.Provider == "gvisor" && !p.Egress.Policy.IsNone() {
			p.egressNet = egressNet
		}
		prov, err := newPoolProvider(ctx, st, p, log)
		if err != nil {
			st.Close()
			return nil, err
		}
		cfg := pool.Config{
			Name: p.Name, TenantID: p.TenantID, Release: p.Release, Target: p.Target,
			ReadyFloor: p.ReadyFloor, MaxProvisioning: p.MaxProvisioning,
			ReadyTTL: time.Duration(p.ReadyTTLSeconds) * time.Second, MaxCell: time.Duration(p.MaxCellSeconds) * time.Second,
			Provider: prov, Image: p.Image, Egress: p.Egress.Policy,
		}
		if len(p.Images) > 0 {
			cfg.Images, cfg.Target, cfg.MaxProvisioning = p.Images, p.MaxCells, p.MaxCold
			cfg.WarmPerImage, cfg.WarmIdle = p.WarmPerImage, time.Duration(p.WarmIdleSeconds)*time.Second
		}
		pools = append(pools, cfg)
	}
	sweep := c.SweepInterval
	if c.DisableExpirySweeper {
		sweep = 0
	}
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(log), sandboxwich.WithPools(pools...),
		sandboxwich.WithMaxLeaseSeconds(c.MaxLeaseSeconds), sandboxwich.WithExecMaxOutput(c.ExecMaxOutputBytes),
		sandboxwich.WithExecMaxOutputCeiling(c.ExecMaxOutputCeilingBytes),
		sandboxwich.WithPoolOptions(pool.WithInterval(c.SweepInterval), pool.WithLockTTL(c.PoolLockTTL)), sandboxwich.WithSweepInterval(sweep),
		sandboxwich.WithMaxPrepareAhead(c.MaxPrepareAhead), sandboxwich.WithClockSync(c.ClockSync),
		sandboxwich.WithEventRetention(c.EventRetention))
	if err != nil {
		st.Close()
		return nil, err
	}
	deliverer, err := buildWebhooks(c, st, log)
	if err != nil {
		st.Close()
		return nil, err
	}
	streamsDone := make(chan struct{})
	h, err := httpapi.New(httpapi.Config{
		Plane: plane,
		Auth: httpapi.Auth{
			TenantTokens: c.TenantTokens, SharedToken: c.APIToken, DefaultTenant: c.DefaultTenant,
			OperatorToken: c.OperatorToken, Workers: c.Workers, AllowInsecureNoAuth: c.AllowInsecureNoAuth,
		},
		Logger:                  log,
		MetricsPublic:           c.MetricsPublic,
		StreamsDone:             streamsDone,
		Collectors:              deliverer.Collectors(),
		MaxRequestsPerPrincipal: c.MaxRequestsPerPrincipal,
	})
	if err != nil {
		st.Close()
		return nil, err
	}
	return &server{cfg: c, log: log, store: st, plane: plane, handler: h, webhooks: deliverer,
		endStreams: sync.OnceFunc(func() { close(streamsDone) }), egress: egressNet}, nil
}

// run serves until ctx ends, then shuts down in order: stop accepting, let
// in-flight requests finish, stop the reconciler (a provider call cut short
// stays recorded and is resumed at the next start), and close the store.
// With a drainTimeout (dev) it ends every pool cell before it waits for the
// requests in flight (shutdownDraining), and fails unless every cell ended
// with proof. It logs at shutdown the bound it returns within.
func (s *server) run(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      time.Duration(s.plane.MaxLeaseSeconds())*time.Second + time.Minute, // outlives the longest exec
		IdleTimeout:       2 * time.Minute,
		// Well above the handler's limit, so the handler answers an
		// oversized header with the JSON envelope (Go's own 431 is text).
		MaxHeaderBytes: 16 * httpapi.MaxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	// Expiries follow the database's clock from the first request on.
	if err := s.plane.SyncClock(ctx); err != nil {
		s.log.Warn("clock sync", "error", err)
	} else if off, unc, ok := s.plane.ClockOffset(); ok {
		s.log.Info("clock offset from the database", "offset", off, "uncertainty", unc)
	}
	if s.endStreams != nil {
		srv.RegisterOnShutdown(s.endStreams)
	}
	planeCtx, stopPlane := context.WithCancel(context.WithoutCancel(ctx))
	planeDone := make(chan error, 1)
	go func() { planeDone <- s.plane.Run(planeCtx) }()
	hooksDone := make(chan error, 1)
	if s.webhooks != nil {
		go func() { hooksDone <- s.webhooks.Run(planeCtx) }()
	} else {
		hooksDone <- nil
	}

	serveErr := make(chan error, 1)
	go func() {
		if s.cfg.TLSCertFile != "" {
			serveErr <- srv.ServeTLS(ln, s.cfg.TLSCertFile, s.cfg.TLSKeyFile)
		} else {
			serveErr <- srv.Serve(ln)
		}
	}()
	stopBackground := func() {
		stopPlane()
		<-planeDone
		<-hooksDone
	}
	var err error
	select {
	case err = <-serveErr:
		stopBackground()
		if s.drainTimeout > 0 {
			err = errors.Join(err, s.drain())
		}
	case <-ctx.Done():
		if s.drainTimeout > 0 {
			s.log.Info("shutting down: ending every cell, live leases included", "grace", s.cfg.ShutdownTimeout,
				"drain_timeout", s.drainTimeout, "exit_within", s.cfg.ShutdownTimeout+s.drainTimeout)
			err = s.shutdownDraining(srv, stopBackground)
		} else {
			s.log.Info("shutting down; cells are kept and reconciled at the next start", "grace", s.cfg.ShutdownTimeout)
			sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
			err = srv.Shutdown(sctx)
			cancel()
			stopBackground()
		}
	}
	if cerr := s.store.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// shutdownDraining is the shutdown of a server that ends its cells (dev):
// it stops accepting requests and, without waiting for those in flight,
// ends every cell, live leases included, so that a command running in a
// cell (a streamed exec) ends now with the release's reason instead of
// holding the grace until it is cut. Requests still in flight then get the
// grace to finish; after that they are cut, which is no failure once every
// cell is proven gone: there is nothing left for them to act on. It
// returns nil when every cell ended with proof of deletion, else why not.
func (s *server) shutdownDraining(srv *http.Server, stopBackground func()) error {
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shutdown := make(chan error, 1)
	go func() { shutdown <- srv.Shutdown(sctx) }()
	stopBackground()
	drainErr := s.drain()
	var err error
	select {
	case err = <-shutdown:
	case <-time.After(s.cfg.ShutdownTimeout):
		cancel()
		err = <-shutdown
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = srv.Close()
		if drainErr == nil {
			s.log.Warn("requests still in flight after the grace were cut; every cell was already gone", "error", err)
			err = nil
		}
	}
	return errors.Join(drainErr, err)
}

func serve(ctx context.Context, e env, args []string) error {
	c, err := loadConfig(e, "serve", args)
	if err != nil {
		return err
	}
	log, err := newLogger(e.stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return err
	}
	if !c.authConfigured() {
		log.Error("no authentication configured: every route except /healthz answers 500 auth_not_configured; " +
			"set SANDBOXWICH_TENANT_TOKENS, SANDBOXWICH_API_TOKEN or SANDBOXWICH_WORKER_TOKENS")
	}
	if c.AllowInsecureNoAuth {
		log.Warn("SANDBOXWICH_ALLOW_INSECURE_NO_AUTH=true: unauthenticated requests act as tenant " + c.DefaultTenant + " — local use only")
	}
	s, err := build(ctx, c, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		s.store.Close()
		return fmt.Errorf("invalid SANDBOXWICH_LISTEN: %w", err)
	}
	scheme := "http"
	if c.TLSCertFile != "" {
		scheme = "https"
	}
	log.Info("sandboxwich serving", "url", scheme+"://"+ln.Addr().String(), "database", redactURL(c.DatabaseURL), "pools", len(c.Pools))
	for _, p := range c.Pools {
		if p.Provider == "dry-run" || p.Provider == "dir" {
			log.Warn("pool uses a simulated provider: cells are SIMULATED, mode dry_run, no isolation exists",
				"pool", p.Name, "provider", p.Provider)
		}
	}
	return s.run(ctx, ln)
}

// drain ends every pool cell, leased ones included, with proof, within
// drainTimeout; the plane must have stopped. Stops it could not finish stay
// recorded and the next start resumes them; it then returns why.
func (s *server) drain() error {
	r := s.plane.Pools()
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.drainTimeout)
	defer cancel()
	if err := r.Drain(ctx); err != nil {
		s.log.Warn("cells not all ended in time; the next start resumes their stops", "error", err)
		return fmt.Errorf("cells not all ended in time (the next start resumes their stops): %w", err)
	}
	s.log.Info("every cell ended, its deletion proven")
	if s.drained != nil {
		s.drained()
	}
	return nil
}

// redactURL drops a database URL's password for logs.
func redactURL(u string) string {
	at := strings.LastIndex(u, "@")
	scheme := strings.Index(u, "://")
	if at < 0 || scheme < 0 {
		return u
	}
	userinfo := u[scheme+3 : at]
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		return u[:scheme+3] + user + ":***" + u[at:]
	}
	return u
}

// buildWebhooks loads the webhook endpoints of the config file, each
// secret file checked (mode 0600), into a deliverer.
func buildWebhooks(c *config, st store.Store, log *slog.Logger) (*webhook.Deliverer, error) {
	var eps []webhook.Endpoint
	for i, w := range c.Webhooks {
		if w.SecretFile == "" {
			return nil, fmt.Errorf("invalid webhooks[%d].secret_file: required", i)
		}
		secrets, err := webhook.LoadSecretFile(w.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("invalid webhooks[%d].secret_file: %w", i, err)
		}
		eps = append(eps, webhook.Endpoint{TenantID: w.TenantID, URL: w.URL, Types: w.Types, Secrets: secrets})
	}
	ws, ok := st.(webhook.Store)
	if !ok {
		return nil, fmt.Errorf("webhooks: the store (%T) keeps no webhook deliveries (store.Webhooks)", st)
	}
	d, err := webhook.New(webhook.Config{Store: ws, Endpoints: eps, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("invalid webhooks: %w", err)
	}
	return d, nil
}
