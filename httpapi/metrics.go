package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Claim outcomes counted by sandboxwich_claims_total.
const (
	outcomeLeased    = "leased"
	outcomeEmpty     = "empty"
	outcomeReplayed  = "replayed"
	outcomeConflict  = "conflict"
	outcomeContended = "contended"
	outcomeError     = "error"
)

// metrics holds the handler's collectors.
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	claims   *prometheus.CounterVec
	// empty counts empty claims that were not replayed, by reason.
	empty *prometheus.CounterVec
}

// newMetrics registers the handler's collectors on reg.
func newMetrics(reg *prometheus.Registry, plane *sandboxwich.Plane) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxwich_http_requests_total",
			Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandboxwich_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern and status code.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route", "code"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxwich_claims_total",
			Help: "Sterile-cell claims by outcome.",
		}, []string{"outcome"}),
		empty: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxwich_claims_empty_total",
			Help: "Sterile-cell claims that found no cell, by reason: no_inventory, expires_too_soon (no ready cell outlives the lease), held_back (ready floor, concurrent claims) or wait_elapsed (a claim that waited in vain).",
		}, []string{"reason"}),
	}
	for _, o := range []string{outcomeLeased, outcomeEmpty, outcomeReplayed, outcomeConflict, outcomeContended, outcomeError} {
		m.claims.WithLabelValues(o)
	}
	for _, r := range []sandboxwich.EmptyReason{sandboxwich.EmptyNoInventory, sandboxwich.EmptyExpiresTooSoon, sandboxwich.EmptyHeldBack,
		sandboxwich.EmptyWaitElapsed} {
		m.empty.WithLabelValues(string(r))
	}
	waiting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sandboxwich_claims_waiting",
		Help: "Claims of this replica waiting for a cell (wait_seconds), first come first served per tenant and release.",
	}, func() float64 { return float64(plane.WaitingClaims()) })
	cs := []prometheus.Collector{m.requests, m.latency, m.claims, m.empty, waiting, newCellCollector(plane), newClockCollector(plane),
		newPoolCollector(plane), newImageCacheCollector(plane), buildInfo()}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("httpapi: register metrics: %w", err)
		}
	}
	return m, nil
}

// buildInfo is the constant sandboxwich_build_info gauge.
func buildInfo() prometheus.Collector {
	version, goVersion := "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		for _, d := range bi.Deps {
			if d.Path == "github.com/sandboxwich/sandboxwich" {
				version = d.Version
			}
		}
		if bi.Main.Path == "github.com/sandboxwich/sandboxwich" {
			version = bi.Main.Version
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "sandboxwich_build_info",
		Help:        "Build information of the sandboxwich module; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": goVersion},
	})
	g.Set(1)
	return g
}

// cellCollector reports cells by state, read from the store at scrape time.
type cellCollector struct {
	plane *sandboxwich.Plane
	desc  *prometheus.Desc
}

func newCellCollector(plane *sandboxwich.Plane) *cellCollector {
	return &cellCollector{plane: plane, desc: prometheus.NewDesc("sandboxwich_cells",
		"Sterile cells by state.", []string{"state"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *cellCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *cellCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.plane.CellCounts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, s := range []lease.State{lease.Ready, lease.Leased, lease.Destroyed, lease.Quarantined} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[s]), string(s))
	}
}

// clockCollector reports the plane's measured offset from the database's
// clock, when it has one (sandboxwich.Plane.ClockOffset).
type clockCollector struct {
	plane             *sandboxwich.Plane
	offset, uncertain *prometheus.Desc
}

func newClockCollector(plane *sandboxwich.Plane) *clockCollector {
	return &clockCollector{plane: plane,
		offset: prometheus.NewDesc("sandboxwich_clock_offset_seconds",
			"What this replica adds to its own clock to read the database's, which every expiry follows.", nil, nil),
		uncertain: prometheus.NewDesc("sandboxwich_clock_uncertainty_seconds",
			"Half the round trip of the best probe of the last clock-offset measurement.", nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *clockCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.offset; ch <- c.uncertain }

// Collect implements prometheus.Collector.
func (c *clockCollector) Collect(ch chan<- prometheus.Metric) {
	if off, unc, ok := c.plane.ClockOffset(); ok {
		ch <- prometheus.MustNewConstMetric(c.offset, prometheus.GaugeValue, off.Seconds())
		ch <- prometheus.MustNewConstMetric(c.uncertain, prometheus.GaugeValue, unc.Seconds())
	}
}

// poolCollector reports, per configured pool, whether its provider is
// failing to prepare (its image cannot be pulled, CONTRACT §15), its
// members by state, and for an image class (CONTRACT §21) how many images
// have a warm cell and how many claims wait for one, read from the
// reconciler at scrape time. Per-image figures are on /v1/pools
// (image_cells), not labels here: an image class may serve thousands of
// images, a series each.
type poolCollector struct {
	plane                          *sandboxwich.Plane
	desc, members, warm, waitingBy *prometheus.Desc
}

func newPoolCollector(plane *sandboxwich.Plane) *poolCollector {
	return &poolCollector{plane: plane, desc: prometheus.NewDesc("sandboxwich_pool_unprepared",
		"1 while the pool's provider cannot prepare its cells (such as a pinned image that cannot be pulled; "+
			"the pool creates no cell and retries with back-off, /v1/pools last_error says why), else 0.", []string{"pool"}, nil),
		members: prometheus.NewDesc("sandboxwich_pool_members",
			"The pool's live members by state (for an image class: provisioning are its cold provisions in flight, "+
				"ready its warm cells).", []string{"pool", "state"}, nil),
		warm: prometheus.NewDesc("sandboxwich_image_class_warm_images",
			"Images of an image class with at least one ready cell, as of its last pass.", []string{"pool"}, nil),
		waitingBy: prometheus.NewDesc("sandboxwich_image_class_claims_waiting",
			"Claims of this replica waiting for a cell of an image class, as of its last pass.", []string{"pool"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	ch <- c.members
	ch <- c.warm
	ch <- c.waitingBy
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sts, err := c.plane.PoolStatus(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, st := range sts {
		v := 0.0
		if st.PrepareError != "" {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, st.Name)
		for _, s := range lease.MemberStates {
			if s.Live() {
				ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(st.Members[s]), st.Name, string(s))
			}
		}
		if len(st.ImageClass) == 0 {
			continue
		}
		warm, waiting := 0, 0
		for _, im := range st.Images {
			if im.Ready > 0 {
				warm++
			}
			waiting += im.Waiting
		}
		ch <- prometheus.MustNewConstMetric(c.warm, prometheus.GaugeValue, float64(warm), st.Name)
		ch <- prometheus.MustNewConstMetric(c.waitingBy, prometheus.GaugeValue, float64(waiting), st.Name)
	}
}

// imageCacheCollector reports the image caches of the plane's pools'
// providers, installation-wide (CONTRACT §21): each cache's bytes once,
// however many pools share it, and the evictions of every provider. It
// reports nothing while no pool's provider keeps an image cache.
type imageCacheCollector struct {
	plane            *sandboxwich.Plane
	bytes, evictions *prometheus.Desc
}

func newImageCacheCollector(plane *sandboxwich.Plane) *imageCacheCollector {
	return &imageCacheCollector{plane: plane,
		bytes: prometheus.NewDesc("sandboxwich_image_cache_bytes",
			"Bytes the images of the image caches take (gVisor image_cache_dir; its budget is image_cache_bytes), "+
				"each cache counted once however many pools share it.", nil, nil),
		evictions: prometheus.NewDesc("sandboxwich_image_cache_evictions_total",
			"Images this server's providers evicted from their image caches to keep within budget "+
				"(least recently used first; never an image a live cell uses).", nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *imageCacheCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.bytes; ch <- c.evictions }

// Collect implements prometheus.Collector.
func (c *imageCacheCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.plane.ImageCacheStats(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.bytes, err)
		return
	}
	if st.Caches == 0 {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(st.Evictions))
}

// serveMetrics serves the registry in the Prometheus exposition format.
// A failing collector is logged and left out; the others are still served.
func (h *handler) serveMetrics(w http.ResponseWriter, r *http.Request) {
	h.promh.ServeHTTP(w, r)
}

// newPromHandler returns the exposition handler of reg.
func newPromHandler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      promLogger{log},
	})
}

// promLogger adapts slog to promhttp's error log.
type promLogger struct{ log *slog.Logger }

func (l promLogger) Println(v ...any) {
	l.log.Error("httpapi: metrics", slog.Any("error", v))
}
