package sandboxwich_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich"
)

// TestAttestationNeverPrinted: a claim's result and its proof print, with
// every fmt verb and through log/slog's text and JSON handlers, everything
// but the attestation. Only ClaimResult.Attestation returns it.
func TestAttestationNeverPrinted(t *testing.T) {
	e := newEnv(t)
	e.prepare(t)
	res, err := e.plane.Claim(e.ctx, "acme", sandboxwich.ClaimRequest{Release: e.rel, Binding: binding})
	if err != nil || res.Lease == nil {
		t.Fatalf("claim: %v %v", res, err)
	}
	att := res.Attestation()
	if !strings.HasPrefix(att, "swla1_") {
		t.Fatalf("Attestation() = %d chars, want a swla1_ token", len(att))
	}
	proof := res.Proof()
	if proof.Generation != res.Lease.Generation || proof.Binding != res.Lease.Binding {
		t.Fatalf("Proof() = %v, want the lease's generation and binding", proof)
	}
	if _, err := e.plane.Validate(e.ctx, "acme", res.Lease.ID, proof); err != nil {
		t.Fatalf("Validate with ClaimResult.Proof(): %v", err)
	}

	var out bytes.Buffer
	for _, v := range []any{res, &res, proof, &proof} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
			fmt.Fprintf(&out, verb+"\n", v)
		}
		fmt.Fprintln(&out, v)
		for _, h := range []slog.Handler{slog.NewTextHandler(&out, nil), slog.NewJSONHandler(&out, nil)} {
			slog.New(h).Info("claim", "result", v, "proof", proof)
		}
	}
	if !strings.Contains(out.String(), res.Lease.ID.String()) {
		t.Fatalf("the printed forms do not even show the lease ID:\n%s", out.String())
	}
	for _, secret := range []string{att, att[len("swla1_"):], fmt.Sprintf("%x", att)} {
		if strings.Contains(out.String(), secret) {
			t.Fatalf("the attestation was printed:\n%s", out.String())
		}
	}
}
