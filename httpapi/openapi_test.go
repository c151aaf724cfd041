package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

var (
	docOnce sync.Once
	doc     *openapi3.T
	docErr  error
)

// loadDoc parses the embedded document once.
func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	docOnce.Do(func() { doc, docErr = openapi3.NewLoader().LoadFromData(OpenAPI()) })
	if docErr != nil {
		t.Fatalf("load openapi.json: %v", docErr)
	}
	return doc
}

// checkSchema validates a response body against a component schema.
func checkSchema(t *testing.T, name string, body []byte) {
	t.Helper()
	d := loadDoc(t)
	ref := d.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		t.Fatalf("no schema %s", name)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if err := d.ValidateSchemaJSON(ref.Value, v); err != nil {
		t.Errorf("%s does not match schema %s: %v", body, name, err)
	}
}

// TestOpenAPIValid: the document is a valid OpenAPI 3 document.
func TestOpenAPIValid(t *testing.T) {
	d := loadDoc(t)
	if err := d.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(d.OpenAPI, "3.") {
		t.Errorf("openapi %q", d.OpenAPI)
	}
}

// TestOpenAPIRoutes: the document lists exactly the routes of the table.
func TestOpenAPIRoutes(t *testing.T) {
	d := loadDoc(t)
	var documented, served []string
	for path, item := range d.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	for _, rt := range routes {
		served = append(served, rt.pattern())
	}
	sort.Strings(documented)
	sort.Strings(served)
	if !slices.Equal(documented, served) {
		t.Errorf("documented routes\n%s\nserved routes\n%s", strings.Join(documented, "\n"), strings.Join(served, "\n"))
	}
	// Every route with a body documents it with its one media type:
	// application/json, or multipart/form-data for uploads. The
	// Idempotency-Key parameter is documented as honoured or as refused,
	// as the route treats it.
	for _, rt := range routes {
		op := d.Paths.Find(rt.path).GetOperation(rt.method)
		if hasBody := op.RequestBody != nil; hasBody != (rt.body || rt.optBody || rt.upload) ||
			(hasBody && op.RequestBody.Value.Required != (rt.body || rt.upload)) {
			t.Errorf("%s: documented body %v, served body %v (optional %v)", rt.pattern(), hasBody, rt.body || rt.upload, rt.optBody)
		}
		if op.RequestBody != nil {
			want := "application/json"
			if rt.upload {
				want = "multipart/form-data"
			}
			if got := slices.Collect(maps.Keys(op.RequestBody.Value.Content)); !slices.Equal(got, []string{want}) {
				t.Errorf("%s: documented body media types %v, want %s", rt.pattern(), got, want)
			}
		}
		var keyRef string
		for _, p := range op.Parameters {
			if p.Value.Name == IdempotencyKeyHeader {
				keyRef = p.Ref
			}
		}
		want := map[idemMode]string{idemNone: "", idemReplay: "#/components/parameters/IdempotencyKey",
			idemErrorsOnly: "#/components/parameters/IdempotencyKey", idemRefused: "#/components/parameters/IdempotencyKeyRefused"}[rt.idem]
		if keyRef != want {
			t.Errorf("%s: documented Idempotency-Key %q, want %q", rt.pattern(), keyRef, want)
		}
		// A route that only streams its answer never stores one.
		if rt.stream != nil && rt.serve == nil && rt.idem != idemRefused {
			t.Errorf("%s streams its answer but does not refuse Idempotency-Key", rt.pattern())
		}
		// Every documented error status but readiness's 503 is one of the
		// shared responses.
		for status, r := range op.Responses.Map() {
			if status[0] >= '4' && status != "503" && !strings.HasPrefix(r.Ref, "#/components/responses/") {
				t.Errorf("%s: response %s is not a shared error response", rt.pattern(), status)
			}
		}
	}
}

// TestOpenAPIErrorCodes: every wire code is in the ErrorResponse enum and
// named by the shared response of its status, and that status is the one
// the handler answers it with.
func TestOpenAPIErrorCodes(t *testing.T) {
	d := loadDoc(t)
	enum := d.Components.Schemas["ErrorResponse"].Value.Properties["code"].Value.Enum
	for code, resp := range map[errcode.Code]string{
		errcode.BadRequest: "BadRequest", errcode.InvalidIdempotencyKey: "BadRequest",
		errcode.InvalidRequest: "Unprocessable", errcode.UserUnsupported: "Unprocessable",
		errcode.ImageNotAllowed: "Unprocessable", errcode.EgressNotAllowed: "Unprocessable",
		errcode.Unauthorized: "Unauthorized", errcode.AuthorizationDenied: "Forbidden", errcode.FileAccessDenied: "Forbidden",
		errcode.NotFound: "NotFound", errcode.FileNotFound: "NotFound", errcode.MethodNotAllowed: "MethodNotAllowed",
		errcode.Conflict: "Conflict", errcode.ClaimContended: "Conflict", errcode.RuntimeClassBoundaryUnverified: "Conflict",
		errcode.CellAgentUnverified: "Conflict", errcode.ImageDigestUnverified: "Conflict",
		errcode.IdempotencyKeyReused: "Conflict", errcode.IdempotencyInProgress: "Conflict",
		errcode.PayloadTooLarge: "PayloadTooLarge", errcode.UnsupportedMediaType: "UnsupportedMediaType",
		errcode.RequestHeaderTooLarge: "RequestHeaderTooLarge", errcode.Internal: "Internal", errcode.AuthNotConfigured: "Internal",
		errcode.ExecUnsupported: "NotImplemented", errcode.InsufficientStorage: "InsufficientStorage",
		errcode.StoreUnavailable: "ServiceUnavailable",
		errcode.EventsExpired:    "Gone",
		errcode.TooManyRequests:  "TooManyRequests",
	} {
		if !slices.Contains(enum, any(string(code))) {
			t.Errorf("%s is not in the ErrorResponse code enum", code)
		}
		r := d.Components.Responses[resp]
		if r == nil {
			t.Errorf("no response %s", resp)
			continue
		}
		desc := *r.Value.Description
		if !strings.Contains(desc, string(code)) {
			t.Errorf("response %s does not name %s: %q", resp, code, desc)
		}
		if status := strconv.Itoa(code.HTTPStatus()); !strings.HasPrefix(desc, status) {
			t.Errorf("%s is answered %s, but documented in %q", code, status, desc)
		}
	}
}

// TestOpenAPIServed: both paths serve the committed bytes, unauthenticated.
func TestOpenAPIServed(t *testing.T) {
	committed, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, OpenAPI()) {
		t.Fatal("OpenAPI() differs from openapi.json")
	}
	eachBackend(t, func(t *testing.T, b backend) {
		e := newEnv(t, b)
		for _, p := range []string{"/v1/openapi.json", "/openapi.json"} {
			r := e.do("GET", p, "", nil).must(t, 200)
			if !bytes.Equal(r.body, committed) {
				t.Errorf("%s serves other bytes", p)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s: Content-Type %q", p, ct)
			}
		}
	})
}

// TestOpenAPISchemasMatchWire: every documented body schema has exactly the
// JSON fields of its wire type.
func TestOpenAPISchemasMatchWire(t *testing.T) {
	d := loadDoc(t)
	for name, v := range map[string]any{
		"Release": wire.Release{}, "ClaimRequest": wire.ClaimRequest{}, "Lease": wire.Lease{},
		"ClaimResponse": wire.ClaimResponse{}, "ValidateRequest": wire.ValidateRequest{},
		"ValidateResponse": wire.ValidateResponse{}, "ReleaseRequest": wire.ReleaseRequest{},
		"LeaseStatus": wire.LeaseStatus{}, "StatusResponse": wire.StatusResponse{},
		"ExecRequest": wire.ExecRequest{}, "ExecResponse": wire.ExecResponse{},
		"PrepareRequest": wire.PrepareRequest{}, "Cell": wire.Cell{}, "CellResponse": wire.CellResponse{},
		"CellClaim": wire.CellClaim{}, "WorkerCellResponse": wire.WorkerCellResponse{},
		"RetireRequest": wire.RetireRequest{}, "DestroyRequest": wire.DestroyRequest{},
		"Pool": wire.Pool{}, "PoolsResponse": wire.PoolsResponse{}, "ErrorResponse": wire.ErrorResponse{},
		"Health": health{}, "HealthComponent": healthComponent{},
		"ExecExit": wire.ExecExit{}, "ExecOutput": wire.ExecOutput{}, "StreamError": wire.StreamError{},
		"LaunchRequest": wire.LaunchRequest{}, "Launch": wire.Launch{}, "LaunchResponse": wire.LaunchResponse{},
		"FileWriteRequest": wire.FileWriteRequest{}, "FileWriteResponse": wire.FileWriteResponse{},
		"FileReadRequest": wire.FileReadRequest{},
		"LeaseSummary":    wire.LeaseSummary{}, "LeasesResponse": wire.LeasesResponse{}, "RevokeRequest": wire.RevokeRequest{},
		"InventoryEntry": wire.InventoryEntry{}, "InventoryResponse": wire.InventoryResponse{},
		"PrefetchRequest": wire.PrefetchRequest{}, "ImageState": wire.ImageState{}, "ImagesResponse": wire.ImagesResponse{},
		"Evidence": wire.Evidence{}, "EvidenceResponse": wire.EvidenceResponse{},
		"Event": wire.Event{}, "EventsResponse": wire.EventsResponse{},
		"WebhookDelivery": wire.WebhookDelivery{}, "DeliveriesResponse": wire.DeliveriesResponse{},
	} {
		ref := d.Components.Schemas[name]
		if ref == nil {
			t.Errorf("no schema %s", name)
			continue
		}
		var props []string
		for p := range ref.Value.Properties {
			props = append(props, p)
		}
		fields := jsonFields(reflect.TypeOf(v))
		sort.Strings(props)
		sort.Strings(fields)
		if !slices.Equal(props, fields) {
			t.Errorf("%s: schema properties %v, wire fields %v", name, props, fields)
		}
	}
}

// jsonFields lists the JSON field names of a struct type, flattening
// embedded structs.
func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-":
		case f.Anonymous && tag == "":
			out = append(out, jsonFields(f.Type)...)
		case tag != "":
			out = append(out, tag)
		case f.IsExported():
			out = append(out, f.Name)
		}
	}
	return out
}
