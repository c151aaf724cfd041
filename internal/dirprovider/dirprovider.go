// Package dirprovider is a simulated provider whose objects are files in a
// directory, so that they outlive a killed process. It is what the
// reference binary's "dir" provider runs, for the crash checks of the
// reliability proof (docs/reliability.md): they count its objects after
// every SIGKILL. Its mode is dry_run: it is never evidence that a sandbox
// existed.
package dirprovider

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/internal/ctxsleep"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Provider keeps one file per object in Dir, named by the cell ID and
// holding its identity, written atomically (temporary file and rename). It
// injects latency and, optionally, destroy faults.
type Provider struct {
	Dir string
	// MinLatency and MaxLatency bound the random delay of every Provision
	// and Destroy.
	MinLatency, MaxLatency time.Duration
	// DestroyUncertain is the probability that a Destroy deletes nothing
	// and reports an uncertain result; LostDestroy the probability that it
	// deletes the object and then reports an error.
	DestroyUncertain, LostDestroy float64
}

var _ interface {
	driver.Provider
	driver.Lister
} = (*Provider)(nil)

// Capabilities implements driver.Provider.
func (p *Provider) Capabilities() driver.Capabilities {
	return driver.Capabilities{Kind: "dir", Mode: driver.DryRun,
		RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk, lease.KataMicroVM}, Identity: "dir"}
}

func (p *Provider) wait(ctx context.Context) error {
	d := p.MinLatency
	if p.MaxLatency > p.MinLatency {
		d += rand.N(p.MaxLatency - p.MinLatency)
	}
	return ctxsleep.Sleep(ctx, d)
}

func (p *Provider) path(cell uuid.UUID) string { return filepath.Join(p.Dir, cell.String()) }

func (p *Provider) read(cell uuid.UUID) (identity, class string, ok bool, err error) {
	b, err := os.ReadFile(p.path(cell))
	if errors.Is(err, os.ErrNotExist) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, err
	}
	identity, class, _ = strings.Cut(strings.TrimSpace(string(b)), " ")
	return identity, class, true, nil
}

// Provision implements driver.Provider. It is idempotent per cell ID.
func (p *Provider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	if req.Image != "" {
		return driver.Object{}, fmt.Errorf("dir: %w", driver.ErrImageUnsupported)
	}
	if err := p.wait(ctx); err != nil {
		return driver.Object{}, err
	}
	id, _, ok, err := p.read(req.CellID)
	if err != nil {
		return driver.Object{}, err
	}
	if !ok {
		id = "dir-" + crand.Text()
		tmp := filepath.Join(p.Dir, ".tmp-"+crand.Text())
		if err := os.WriteFile(tmp, []byte(id+" "+string(req.RuntimeClass)+"\n"), 0o600); err != nil {
			return driver.Object{}, err
		}
		if err := os.Rename(tmp, p.path(req.CellID)); err != nil {
			return driver.Object{}, err
		}
	}
	return driver.Object{CellID: req.CellID, Identity: id}, nil
}

// Inspect implements driver.Provider.
func (p *Provider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	if err := ctx.Err(); err != nil {
		return driver.Observation{}, err
	}
	id, class, ok, err := p.read(obj.CellID)
	if err != nil || !ok {
		return driver.Observation{Detail: "no such object"}, err
	}
	return driver.Observation{Exists: true, Identity: id, RuntimeClass: lease.RuntimeClass(class), Ready: true,
		Detail: "simulated (dry_run)"}, nil
}

// Destroy implements driver.Provider.
func (p *Provider) Destroy(ctx context.Context, obj driver.Object) error {
	if err := p.wait(ctx); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrUncertain, err)
	}
	if rand.Float64() < p.DestroyUncertain {
		return fmt.Errorf("%w: injected: delete accepted, absence not confirmed", driver.ErrUncertain)
	}
	id, _, ok, err := p.read(obj.CellID)
	if err != nil {
		return fmt.Errorf("%w: %w", driver.ErrUncertain, err)
	}
	if ok && (obj.Identity == "" || obj.Identity == id) {
		if err := os.Remove(p.path(obj.CellID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %w", driver.ErrUncertain, err)
		}
	}
	if rand.Float64() < p.LostDestroy {
		return fmt.Errorf("%w: injected: destroy response lost", driver.ErrUncertain)
	}
	return nil
}

// List implements driver.Lister.
func (p *Provider) List(ctx context.Context) ([]driver.Object, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(p.Dir)
	if err != nil {
		return nil, err
	}
	var out []driver.Object
	for _, e := range entries {
		cell, err := uuid.Parse(e.Name())
		if err != nil {
			continue // a temporary file left by a crash is not an object
		}
		id, _, ok, err := p.read(cell)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, driver.Object{CellID: cell, Identity: id})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CellID.String() < out[j].CellID.String() })
	return out, nil
}
