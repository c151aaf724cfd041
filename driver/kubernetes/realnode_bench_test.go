package kubernetes_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/internal/k8stest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// BenchmarkRealNodeRefill measures a pool refill on the real node: N cells
// provisioned with at most P Provision calls at once (what pool.Config's
// MaxProvisioning bounds) against ⌈N/P⌉ × the median single Pod
// create→Ready (Provision) measured in the same run. It reports
// refill_ratio (target ≤ 1.25) and the single provision in ms.
//
//	go test -run '^$' -bench RealNodeRefill -benchtime 1x ./driver/kubernetes/
func BenchmarkRealNodeRefill(b *testing.B) {
	const cells, maxProvisioning = 8, 4
	node := k8stest.SharedNode(b)
	ns := node.Namespace(b)
	p := newRealProvider(b, node, ns, "refill")
	ctx := ctxT(b, 10*time.Minute)
	provision := func() (driver.Object, time.Duration) {
		start := time.Now()
		obj, err := p.Provision(ctx, provisionReq(lease.GVisorLowerRisk))
		if err != nil {
			b.Fatalf("Provision: %v", err)
		}
		return obj, time.Since(start)
	}
	destroy := func(objs []driver.Object) {
		var wg sync.WaitGroup
		for _, o := range objs {
			wg.Go(func() {
				if err := p.Destroy(ctx, o); err != nil {
					b.Errorf("Destroy: %v", err)
				}
			})
		}
		wg.Wait()
	}
	var ratios, singles []float64
	for b.Loop() {
		var one []time.Duration
		for range 3 {
			obj, d := provision()
			one = append(one, d)
			destroy([]driver.Object{obj})
		}
		slices.Sort(one)
		single := one[1]

		sem := make(chan struct{}, maxProvisioning)
		objs := make([]driver.Object, cells)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range cells {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				objs[i], _ = provision()
			})
		}
		wg.Wait()
		took := time.Since(start)
		destroy(objs)
		ideal := time.Duration((cells+maxProvisioning-1)/maxProvisioning) * single
		ratios = append(ratios, float64(took)/float64(ideal))
		singles = append(singles, float64(single.Milliseconds()))
		b.Logf("refill: %d cells, max %d at once: %v; single create→Ready %v; ideal %v; ratio %.3f",
			cells, maxProvisioning, took.Round(time.Millisecond), single.Round(time.Millisecond), ideal.Round(time.Millisecond), ratios[len(ratios)-1])
	}
	b.ReportMetric(median(ratios), "refill_ratio")
	b.ReportMetric(median(singles), "single_ms")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
