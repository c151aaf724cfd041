package cloudflare_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/cloudflare"
	"github.com/sandboxwich/sandboxwich/lease"
)

// ExampleNew configures a pool of Cloudflare cells: the bridge, the cell
// image, the explicit runtime class, and the read-back that proves the
// deployment. (It needs a deployed bridge and an API token to run.)
func ExampleNew() {
	p, err := cloudflare.New(cloudflare.Config{
		BridgeURL:       "https://sandboxwich-bridge.example.workers.dev",
		BridgeTokenFile: "/etc/sandboxwich/bridge-token",
		Pool:            "cf", Installation: "inst-1",
		RuntimeClass: lease.GVisorLowerRisk, // the operator's decision: no default
		Image:        "registry.cloudflare.com/acct/sandboxwich-cell@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		InstanceType: "basic",
		AgentDigest:  "sha256:" + "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210",
		ReadBack: cloudflare.ReadBack{
			APITokenFile: "/etc/sandboxwich/cloudflare-api-token", AccountID: "0123456789abcdef0123456789abcdef",
			WorkerName: "sandboxwich-bridge", ContainerApplicationID: "a1b2c3d4-0000-4000-8000-000000000001",
			CompatibilityDate: "2026-04-26", CompatibilityFlags: []string{"enable_request_signal"},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.VerifyDeployment(ctx); err != nil {
		log.Fatal(err) // cells would not be admitted: runtime_class_boundary_unverified
	}
	obj, err := p.Provision(ctx, driver.ProvisionRequest{CellID: uuid.Must(uuid.NewV7()), RuntimeClass: lease.GVisorLowerRisk})
	if err != nil {
		log.Fatal(err)
	}
	o, err := p.Inspect(ctx, obj)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(driver.Verify(obj, o, lease.GVisorLowerRisk) == nil)
	if err := p.Destroy(ctx, obj); err != nil {
		log.Fatal(err) // driver.ErrUncertain: the cell stays quarantined until a later Destroy proves it
	}
}
