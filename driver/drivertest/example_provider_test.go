package drivertest_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// vmProvider is a custom driver: each cell is a "VM" of an imaginary
// provider, kept here in a map. A real driver talks to its provider in
// the same four methods, and nothing else: fences, states and runtime
// verification live in the plane.
type vmProvider struct {
	mu   sync.Mutex
	vms  map[uuid.UUID]string // cell → the VM's identity
	next int
}

func (p *vmProvider) Capabilities() driver.Capabilities {
	return driver.Capabilities{Kind: "vm", Mode: driver.Apply,
		RuntimeClasses: []lease.RuntimeClass{lease.KataMicroVM}, Identity: "vm:example"}
}

func (p *vmProvider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	if err := ctx.Err(); err != nil {
		return driver.Object{}, err
	}
	if req.Image != "" { // the VM image is the host's choice: no image class
		return driver.Object{}, driver.ErrImageUnsupported
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.vms[req.CellID]
	if !ok { // idempotent per cell ID: a retry finds the VM it made
		p.next++
		id = "vm-" + strconv.Itoa(p.next)
		p.vms[req.CellID] = id
	}
	return driver.Object{CellID: req.CellID, Identity: id}, nil
}

func (p *vmProvider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	if err := ctx.Err(); err != nil {
		return driver.Observation{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.vms[obj.CellID]
	if !ok {
		return driver.Observation{Detail: "no VM for the cell"}, nil
	}
	// Report what the provider admitted, read back, never what was asked.
	return driver.Observation{Exists: true, Identity: id, RuntimeClass: lease.KataMicroVM, Ready: true, Detail: "VM " + id}, nil
}

func (p *vmProvider) Destroy(ctx context.Context, obj driver.Object) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrUncertain, err) // not proven: the plane retries
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id, ok := p.vms[obj.CellID]; ok && (obj.Identity == "" || obj.Identity == id) {
		delete(p.vms, obj.CellID)
	}
	return nil // the exact object is absent: proof
}

func (p *vmProvider) List(context.Context) ([]driver.Object, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	objs := make([]driver.Object, 0, len(p.vms))
	for cell, id := range p.vms {
		objs = append(objs, driver.Object{CellID: cell, Identity: id})
	}
	return objs, nil
}

// vmHarness makes the providers of the suite. A "restarted" provider must
// see the objects earlier ones made: here they share the map, as a real
// driver's processes share the provider's account.
type vmHarness struct{ p *vmProvider }

func (h vmHarness) MakeProvider(context.Context, *testing.T) (driver.Provider, error) {
	return h.p, nil
}
func (h vmHarness) RuntimeClass() lease.RuntimeClass { return lease.KataMicroVM }

// conformance is what the driver's own test calls:
//
//	func TestConformance(t *testing.T) { conformance(t) }
func conformance(t *testing.T) {
	drivertest.Run(t, vmHarness{p: &vmProvider{vms: map[uuid.UUID]string{}}})
}

// Example_customProvider shows a custom driver and how its test proves it
// with drivertest.Run (conformance, above, which this package's
// TestCustomProviderConformance runs).
func Example_customProvider() {
	p := &vmProvider{vms: map[uuid.UUID]string{}}
	obj, _ := p.Provision(context.Background(), driver.ProvisionRequest{CellID: uuid.New(), RuntimeClass: lease.KataMicroVM})
	o, _ := p.Inspect(context.Background(), obj)
	fmt.Println(driver.Verify(obj, o, lease.KataMicroVM) == nil, p.Destroy(context.Background(), obj))
	// Output: true <nil>
}
