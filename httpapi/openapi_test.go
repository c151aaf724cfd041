package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

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
	// Every route with a body documents it, and every body route requires
	// application/json.
	for _, rt := range routes {
		op := d.Paths.Find(rt.path).GetOperation(rt.method)
		if hasBody := op.RequestBody != nil; hasBody != (rt.body || rt.optBody) ||
			(hasBody && op.RequestBody.Value.Required != rt.body) {
			t.Errorf("%s: documented body %v, served body %v (optional %v)", rt.pattern(), hasBody, rt.body, rt.optBody)
		}
		hasKey := slices.ContainsFunc(op.Parameters, func(p *openapi3.ParameterRef) bool { return p.Value.Name == IdempotencyKeyHeader })
		if hasKey != (rt.idem != idemNone) {
			t.Errorf("%s: documented Idempotency-Key %v", rt.pattern(), hasKey)
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
