package drivertest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// memStore is the backing state that every provider of one harness shares,
// as a real provider's providers share the provider's own state.
type memStore struct {
	mu      sync.Mutex
	objects map[uuid.UUID]string // cell → identity
	next    int
}

// memProvider is a minimal in-memory provider (no exec). fault names one
// way to break it, to show the suite notices.
type memProvider struct {
	s     *memStore
	fault string
}

func (p *memProvider) Capabilities() driver.Capabilities {
	return driver.Capabilities{Kind: "memory", Mode: driver.DryRun,
		RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk}, Identity: "memory:test"}
}

func (p *memProvider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	if err := ctx.Err(); err != nil && p.fault != "ignores-cancel" {
		return driver.Object{}, err
	}
	if req.Image != "" && p.fault != "ignores-image" {
		return driver.Object{}, driver.ErrImageUnsupported
	}
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if id, ok := p.s.objects[req.CellID]; ok && p.fault != "new-identity" {
		return driver.Object{CellID: req.CellID, Identity: id}, nil
	}
	p.s.next++
	id := fmt.Sprintf("mem-%d", p.s.next)
	p.s.objects[req.CellID] = id
	return driver.Object{CellID: req.CellID, Identity: id}, nil
}

func (p *memProvider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	if err := ctx.Err(); err != nil {
		return driver.Observation{}, err
	}
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	id, ok := p.s.objects[obj.CellID]
	if !ok {
		return driver.Observation{Detail: "absent"}, nil
	}
	class := lease.GVisorLowerRisk
	if p.fault == "wrong-class" {
		class = ""
	}
	return driver.Observation{Exists: true, Identity: id, RuntimeClass: class, Ready: true, Detail: "in memory"}, nil
}

func (p *memProvider) Destroy(ctx context.Context, obj driver.Object) error {
	if err := ctx.Err(); err != nil {
		return errors.Join(driver.ErrUncertain, err)
	}
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	id, ok := p.s.objects[obj.CellID]
	if !ok && p.fault == "destroy-absent-errors" {
		return errors.New("no such object")
	}
	if ok && (obj.Identity == "" || obj.Identity == id) && p.fault != "destroy-keeps" {
		delete(p.s.objects, obj.CellID)
	}
	return nil
}

func (p *memProvider) List(ctx context.Context) ([]driver.Object, error) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	var objs []driver.Object
	if p.fault == "list-empty" {
		return nil, nil
	}
	for cell, id := range p.s.objects {
		objs = append(objs, driver.Object{CellID: cell, Identity: id})
	}
	return objs, nil
}

type memHarness struct {
	s     *memStore
	fault string
}

func newMemHarness(fault string) memHarness {
	return memHarness{s: &memStore{objects: map[uuid.UUID]string{}}, fault: fault}
}

func (h memHarness) MakeProvider(context.Context, *testing.T) (driver.Provider, error) {
	return &memProvider{s: h.s, fault: h.fault}, nil
}

func (h memHarness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

// TestRunInMemory runs the suite against a correct provider without exec:
// everything but the exec subtests must pass.
func TestRunInMemory(t *testing.T) {
	h := newMemHarness("")
	drivertest.Run(t, h)
	if n := len(h.s.objects); n != 0 {
		t.Errorf("the suite left %d objects behind", n)
	}
}

const faultEnv = "DRIVERTEST_FAULT"

// TestRunCatchesFaults runs the suite, in a child test process, against
// providers broken in one way each, and requires the suite to fail them in
// the right subtest.
func TestRunCatchesFaults(t *testing.T) {
	if fault := os.Getenv(faultEnv); fault != "" {
		// The child: expected to fail.
		drivertest.Run(t, newMemHarness(fault))
		return
	}
	for fault, subtest := range map[string]string{
		"destroy-keeps":         "Destroy",
		"destroy-absent-errors": "DestroyAbsent",
		"new-identity":          "ProvisionIdempotent",
		"wrong-class":           "ProvisionInspect",
		"ignores-cancel":        "Cancellation",
		"list-empty":            "ListAfterRestart",
		"ignores-image":         "Images",
	} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestRunCatchesFaults$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), faultEnv+"="+fault)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a provider with fault %s:\n%s", fault, out)
			}
			if want := "--- FAIL: TestRunCatchesFaults/Conformance/" + subtest + " "; !strings.Contains(string(out), want) {
				t.Errorf("fault %s: no %q in the output:\n%s", fault, want, out)
			}
		})
	}
}

// TestCustomProviderConformance runs the suite the custom-provider example
// shows, so the example is a proven driver.
func TestCustomProviderConformance(t *testing.T) { conformance(t) }
