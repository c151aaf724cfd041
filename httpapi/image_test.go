package httpapi

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/wire"
)

// unpreparedProvider is the fake provider whose Prepare fails (an image
// that cannot be pulled) until the test lets it succeed.
type unpreparedProvider struct {
	*fake.Provider
	ok *atomic.Bool
}

func (p unpreparedProvider) Prepare(context.Context) error {
	if p.ok.Load() {
		return nil
	}
	return errors.New("image registry.example/cell@sha256:…: MANIFEST_UNKNOWN")
}

// TestPoolImageUnavailable: a pool whose provider cannot prepare its image
// shows it in /v1/pools last_error and in sandboxwich_pool_unprepared,
// creates no member, and recovers once the image can be pulled.
func TestPoolImageUnavailable(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ok := new(atomic.Bool)
		e := newEnvWith(t, b, []sandboxwich.Option{sandboxwich.WithPools(pool.Config{
			Name: "p1", TenantID: "acme", Release: signedRelease(t, lease.GVisorLowerRisk), Target: 1,
			Provider: unpreparedProvider{fake.New(fake.Config{}), ok},
		})})
		e.plane.Pools().Pass(context.Background())
		pools := string(e.do("GET", "/v1/pools", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200).body)
		if !strings.Contains(pools, "MANIFEST_UNKNOWN") || !strings.Contains(pools, `"provisioning":0,"quarantined":0,"ready":0`) {
			t.Errorf("/v1/pools while the image cannot be pulled: %s", pools)
		}
		metrics := string(e.do("GET", "/metrics", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200).body)
		if !strings.Contains(metrics, `sandboxwich_pool_unprepared{pool="p1"} 1`) {
			t.Errorf("metrics lack the unprepared pool:\n%s", metrics)
		}
		ok.Store(true)
		e.plane.Pools().Pass(context.Background())
		metrics = string(e.do("GET", "/metrics", tokAcme, nil, wire.OperatorHeader, tokOperator).must(t, 200).body)
		if !strings.Contains(metrics, `sandboxwich_pool_unprepared{pool="p1"} 0`) {
			t.Errorf("metrics once the image is pulled lack the prepared pool")
		}
	})
}
