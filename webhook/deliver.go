package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/wire"
)

// Delivery policy (CONTRACT §16).
const (
	// Timeout bounds one attempt.
	Timeout = 10 * time.Second
	// RetryFor is how long a delivery is retried after its first attempt.
	RetryFor = 24 * time.Hour
	// MaxAttempts bounds its attempts.
	MaxAttempts = 20
	// BackoffBase and BackoffMax bound the wait before a retry: full
	// jitter over base·2ⁿ⁻¹, at most max.
	BackoffBase = time.Second
	BackoffMax  = time.Hour
)

// Store is what a Deliverer needs of a store: its event log and the
// optional ability to keep webhook deliveries (both shipped stores have it;
// a store.Store without it cannot deliver webhooks).
type Store interface {
	store.EventLog
	store.Webhooks
}

// Config configures a Deliverer.
type Config struct {
	Store     Store
	Endpoints []Endpoint
	// Owner names this deliverer in delivery leases (default a new UUID).
	Owner string
	// Interval is the pause between passes (default 1 s).
	Interval time.Duration
	// LockTTL is how long a leased delivery stays this deliverer's
	// (default a minute: longer than an attempt).
	LockTTL time.Duration
	// Client sends deliveries (default: Timeout, no redirects followed).
	Client *http.Client
	// Now is the clock (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
	// Backoff is the wait before retry n (n ≥ 1) (default full jitter over
	// BackoffBase·2ⁿ⁻¹, at most BackoffMax).
	Backoff func(n int) time.Duration
}

// Deliverer delivers the log to the endpoints. Create it with New, then
// Run it; register Collectors with the server's metrics.
type Deliverer struct {
	cfg       Config
	endpoints map[string]Endpoint
	start     map[string]uint64

	attempts *prometheus.CounterVec
	pending  *prometheus.Desc
	mu       sync.Mutex
	counts   map[string]map[string]int
}

// New checks the endpoints and returns a Deliverer.
func New(cfg Config) (*Deliverer, error) {
	if cfg.Store == nil {
		return nil, errors.New("webhook: Config.Store is required")
	}
	if cfg.Owner == "" {
		cfg.Owner = "deliverer-" + uuid.NewString()
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = time.Minute
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: Timeout, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // a redirect is an answer, not a 2xx
		}}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Backoff == nil {
		cfg.Backoff = backoff
	}
	d := &Deliverer{cfg: cfg, endpoints: map[string]Endpoint{}, start: map[string]uint64{},
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandboxwich_webhook_attempts_total",
			Help: "Webhook delivery attempts by endpoint and outcome (delivered, retry, failed)."}, []string{"endpoint", "outcome"}),
		pending: prometheus.NewDesc("sandboxwich_webhook_deliveries", "Webhook deliveries by endpoint and status (pending, delivered, failed).",
			[]string{"endpoint", "status"}, nil),
	}
	for i, e := range cfg.Endpoints {
		if err := e.Check(); err != nil {
			return nil, fmt.Errorf("webhook %d: %w", i+1, err)
		}
		if _, dup := d.endpoints[e.ID()]; dup {
			return nil, fmt.Errorf("webhook %d: the same tenant and url are configured twice", i+1)
		}
		d.endpoints[e.ID()] = e
	}
	return d, nil
}

// backoff is full jitter over BackoffBase·2ⁿ⁻¹, at most BackoffMax.
func backoff(n int) time.Duration {
	w := BackoffBase
	for i := 1; i < n && w < BackoffMax; i++ {
		w *= 2
	}
	return rand.N(min(w, BackoffMax) + 1)
}

// Collectors returns the deliverer's metrics: attempts by outcome, and
// deliveries by status as the database counts them.
func (d *Deliverer) Collectors() []prometheus.Collector {
	return []prometheus.Collector{d.attempts, countsCollector{d}}
}

type countsCollector struct{ d *Deliverer }

func (c countsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.d.pending }

func (c countsCollector) Collect(ch chan<- prometheus.Metric) {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	for ep, m := range c.d.counts {
		for st, n := range m {
			ch <- prometheus.MustNewConstMetric(c.d.pending, prometheus.GaugeValue, float64(n), ep, st)
		}
	}
}

// Run delivers until ctx ends. An endpoint seen for the first time starts
// at the newest event: it receives what happens after it was configured.
func (d *Deliverer) Run(ctx context.Context) error {
	if len(d.endpoints) == 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := d.Pass(ctx); err != nil && ctx.Err() == nil {
			d.cfg.Logger.Warn("webhook pass", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Pass runs one pass: it records the deliveries of new events, then sends
// every delivery due. It returns the number of attempts made.
func (d *Deliverer) Pass(ctx context.Context) (int, error) {
	var errs []error
	for id, e := range d.endpoints {
		if err := d.enqueue(ctx, id, e); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
		}
	}
	n := 0
	for {
		now := d.cfg.Now()
		batch, err := d.cfg.Store.LeaseDeliveries(ctx, store.DeliveryLease{Owner: d.cfg.Owner, Now: now,
			Until: now.Add(d.cfg.LockTTL), Limit: 16})
		if err != nil {
			errs = append(errs, err)
			break
		}
		var wg sync.WaitGroup
		for _, dl := range batch {
			wg.Go(func() {
				if err := d.attempt(ctx, dl); err != nil {
					d.cfg.Logger.Warn("webhook delivery not recorded", "endpoint", dl.Endpoint, "event_id", dl.EventID, "error", err)
				}
			})
		}
		wg.Wait()
		n += len(batch)
		if len(batch) < 16 || ctx.Err() != nil {
			break
		}
	}
	if counts, err := d.cfg.Store.DeliveryCounts(ctx); err == nil {
		d.mu.Lock()
		d.counts = counts
		d.mu.Unlock()
	}
	return n, errors.Join(errs...)
}

func (d *Deliverer) enqueue(ctx context.Context, id string, e Endpoint) error {
	start, ok := d.start[id]
	if !ok {
		last, err := d.cfg.Store.LastEventID(ctx)
		if err != nil {
			return err
		}
		start, d.start[id] = last, last
	}
	for range 100 { // up to 50 000 events a pass
		n, err := d.cfg.Store.EnqueueDeliveries(ctx, store.DeliveryEnqueue{Endpoint: id, TenantID: e.TenantID, Types: e.Types,
			Start: start, Limit: 500, Now: d.cfg.Now()})
		if err != nil || n == 0 {
			return err
		}
	}
	return nil
}

// attempt sends one delivery and records its outcome.
func (d *Deliverer) attempt(ctx context.Context, dl store.Delivery) error {
	e, ok := d.endpoints[dl.Endpoint]
	out := store.DeliveryOutcome{Endpoint: dl.Endpoint, EventID: dl.EventID, Owner: d.cfg.Owner}
	switch {
	case !ok:
		out.Status, out.Error = store.DeliveryFailed, "the endpoint is no longer configured"
	case dl.Event == nil:
		out.Status, out.Error = store.DeliveryFailed, "the event was pruned from the log before delivery"
	default:
		code, err := d.send(ctx, e, dl.Event)
		out.HTTPStatus = code
		switch {
		case err == nil:
			out.Status = store.DeliveryDelivered
		case ctx.Err() != nil:
			return nil // shutting down: the lock expires and another attempt follows
		default:
			out.Error = err.Error()
			first := dl.CreatedAt
			next := d.cfg.Now().Add(d.cfg.Backoff(dl.Attempts + 1))
			if dl.Attempts+1 >= MaxAttempts || next.Sub(first) > RetryFor {
				out.Status = store.DeliveryFailed
			} else {
				out.Status, out.Next = store.DeliveryPending, next
			}
		}
	}
	outcome := map[string]string{store.DeliveryDelivered: "delivered", store.DeliveryPending: "retry", store.DeliveryFailed: "failed"}[out.Status]
	d.attempts.WithLabelValues(dl.Endpoint, outcome).Inc()
	if out.Status == store.DeliveryFailed {
		d.cfg.Logger.Warn("webhook delivery failed", "endpoint", dl.Endpoint, "event_id", dl.EventID,
			"attempts", dl.Attempts+1, "status", out.HTTPStatus, "error", out.Error)
	}
	out.Now = d.cfg.Now()
	return d.cfg.Store.FinishDelivery(context.WithoutCancel(ctx), out)
}

// send POSTs the event and reports the answer's status; an error for
// anything but 2xx. The error names the status or the transport's failure,
// never the body of either side.
func (d *Deliverer) send(ctx context.Context, e Endpoint, ev *store.Event) (int, error) {
	body, err := json.Marshal(wire.LogEvent(*ev).Wire())
	if err != nil {
		return 0, err
	}
	id := strconv.FormatUint(ev.ID, 10)
	now := d.cfg.Now()
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(body))
	if err != nil {
		return 0, errors.New("bad request URL")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sandboxwich-webhook")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", Sign(e.Secrets, id, now, body))
	resp, err := d.cfg.Client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, errors.New("timeout")
		}
		return 0, errors.New("transport error") // its text may name the URL
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}
