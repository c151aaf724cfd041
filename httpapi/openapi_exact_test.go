package httpapi

import (
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// The document says exactly what the server accepts: each pattern below is
// compared with the code that decides, over inputs that straddle its rules.
// (sdks/python/tests/test_schemathesis.py checks the same against a running
// server.)

// schemaPattern compiles the pattern of a component schema's property.
func schemaPattern(t *testing.T, schema, prop string) *regexp.Regexp {
	t.Helper()
	s := loadDoc(t).Components.Schemas[schema]
	if s == nil || s.Value.Properties[prop] == nil {
		t.Fatalf("no %s.%s", schema, prop)
	}
	return mustPattern(t, schema+"."+prop, s.Value.Properties[prop].Value)
}

func mustPattern(t *testing.T, what string, s *openapi3.Schema) *regexp.Regexp {
	t.Helper()
	if s.Pattern == "" {
		t.Fatalf("%s has no pattern", what)
	}
	re, err := regexp.Compile(s.Pattern)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return re
}

// operation returns the documented operation of a route.
func operation(t *testing.T, method, p string) *openapi3.Operation {
	t.Helper()
	item := loadDoc(t).Paths.Find(p)
	if item == nil || item.GetOperation(method) == nil {
		t.Fatalf("no %s %s", method, p)
	}
	return item.GetOperation(method)
}

// queryParam returns a documented parameter of an operation.
func queryParam(t *testing.T, op *openapi3.Operation, name string) *openapi3.Parameter {
	t.Helper()
	for _, p := range op.Parameters {
		if p.Value != nil && p.Value.Name == name {
			return p.Value
		}
	}
	t.Fatalf("no parameter %s", name)
	return nil
}

// strings over alphabet of length 0 to n.
func allStrings(alphabet string, n int) []string {
	out, level := []string{""}, []string{""}
	for range n {
		var next []string
		for _, s := range level {
			for _, c := range alphabet {
				next = append(next, s+string(c))
			}
		}
		out, level = append(out, next...), next
	}
	return out
}

// TestOpenAPIModeIsParseMode: the file mode pattern accepts exactly what
// parseMode does ("" and null mean 0644).
func TestOpenAPIModeIsParseMode(t *testing.T) {
	re := schemaPattern(t, "FileWriteRequest", "mode")
	inputs := append(allStrings("01478", 5), "0o644", "+644", "0x1ff", "-644", " 644", "644 ", "1_0", "٦٤٤")
	for _, s := range inputs {
		_, err := parseMode(s)
		if got, want := re.MatchString(s), err == nil; got != want {
			t.Errorf("mode %q: pattern says %v, server %v (%v)", s, got, want, err)
		}
	}
}

// TestOpenAPIPathsAreAbsolute: cwd and file paths are absolute and hold no
// NUL byte; a written path names a file (not ending in /, /. or /..).
func TestOpenAPIPathsAreAbsolute(t *testing.T) {
	samples := append(allStrings("/a.", 4), "/a\x00b", "\x00", "/é/ü", "//", "/a/...", "/a/.b", "/a/b.")
	absolute := func(p string) bool { return path.IsAbs(p) && !strings.Contains(p, "\x00") }
	file := func(p string) bool {
		return absolute(p) && !strings.HasSuffix(p, "/") && !strings.HasSuffix(p, "/.") && !strings.HasSuffix(p, "/..")
	}
	for _, tc := range []struct {
		schema, prop string
		valid        func(string) bool
	}{
		{"ExecRequest", "cwd", absolute}, {"LaunchRequest", "cwd", absolute},
		{"FileReadRequest", "path", absolute}, {"FileWriteRequest", "path", file},
	} {
		re := schemaPattern(t, tc.schema, tc.prop)
		for _, s := range samples {
			if got, want := re.MatchString(s), tc.valid(s); got != want {
				t.Errorf("%s.%s %q: pattern says %v, server %v", tc.schema, tc.prop, s, got, want)
			}
		}
	}
	// argv strings and env values hold no NUL byte.
	for _, n := range []string{"ExecRequest", "LaunchRequest"} {
		props := loadDoc(t).Components.Schemas[n].Value.Properties
		for what, s := range map[string]*openapi3.Schema{
			"argv items": props["argv"].Value.Items.Value, "env values": props["env"].Value.AdditionalProperties.Schema.Value,
		} {
			re := mustPattern(t, n+" "+what, s)
			if !re.MatchString("a b\tc") || re.MatchString("a\x00") {
				t.Errorf("%s %s: pattern %q does not refuse exactly NUL", n, what, s.Pattern)
			}
		}
	}
}

// TestOpenAPIIdempotencyKey: the honoured key's pattern accepts exactly what
// idempotencyKey does (blank counts as absent), and every route that refuses
// the header documents only blank values, and its 400.
func TestOpenAPIIdempotencyKey(t *testing.T) {
	p := loadDoc(t).Components.Parameters
	honoured := mustPattern(t, "IdempotencyKey", p["IdempotencyKey"].Value.Schema.Value)
	refused := mustPattern(t, "IdempotencyKeyRefused", p["IdempotencyKeyRefused"].Value.Schema.Value)
	keys := []string{"", " ", "\t \t", "k", " k ", "a b", "a\x01b", "é", "\x7f", strings.Repeat("k", 128),
		strings.Repeat("k", 129), " " + strings.Repeat("k", 128) + "\t", "k" + strings.Repeat(" ", 126) + "k", "~!"}
	for _, k := range keys {
		r := &http.Request{Header: http.Header{IdempotencyKeyHeader: {k}}}
		_, present, err := idempotencyKey(r)
		if got, want := honoured.MatchString(k), err == nil; got != want {
			t.Errorf("Idempotency-Key %q: pattern says %v, server %v (%v)", k, got, want, err)
		}
		if got, want := refused.MatchString(k), err == nil && !present; got != want {
			t.Errorf("refused Idempotency-Key %q: pattern says %v, blank %v", k, got, want)
		}
	}
	for _, rt := range routes {
		if rt.idem != idemRefused {
			continue
		}
		op := operation(t, rt.method, rt.path)
		if op.Responses.Value("400") == nil || !strings.Contains(op.Description, "Idempotency-Key") {
			t.Errorf("%s refuses Idempotency-Key but does not document it (400, description)", rt.pattern())
		}
	}
}

// TestOpenAPIEventsQuery: event ids are what strconv.ParseUint(v, 10, 63)
// takes; pool and cursor are never empty; limit is only with format=json;
// the stream is described frame by frame.
func TestOpenAPIEventsQuery(t *testing.T) {
	events := operation(t, http.MethodGet, "/v1/events")
	ids := []string{"0", "1", "007", "9223372036854775807", "9223372036854775808", "09223372036854775807",
		"18446744073709551615", "99999999999999999999", "", "-1", "+1", "1e3", " 1", "12a"}
	for _, n := range []uint64{1 << 62, 1<<63 - 2, 1e18, 999999999999999999, 8999999999999999999} {
		ids = append(ids, strconv.FormatUint(n, 10), strconv.FormatUint(n+1<<62, 10))
	}
	for what, s := range map[string]*openapi3.Schema{
		"after":            queryParam(t, events, "after").Schema.Value,
		"Last-Event-ID":    queryParam(t, events, "Last-Event-ID").Schema.Value,
		"deliveries after": queryParam(t, operation(t, http.MethodGet, "/v1/webhooks/deliveries"), "after").Schema.Value,
	} {
		re := mustPattern(t, what, s)
		for _, id := range ids {
			_, err := strconv.ParseUint(id, 10, 63)
			if got, want := re.MatchString(id), err == nil; got != want {
				t.Errorf("%s %q: pattern says %v, server %v", what, id, got, want)
			}
		}
	}
	if s := queryParam(t, events, "pool").Schema.Value; s.MinLength != 1 || s.MaxLength == nil || *s.MaxLength != 128 {
		t.Errorf("events pool: minLength %d maxLength %v, want 1 and 128", s.MinLength, s.MaxLength)
	}
	if s := queryParam(t, operation(t, http.MethodGet, "/v1/sterile-cell-leases"), "cursor").Schema.Value; s.MinLength != 1 {
		t.Errorf("listing cursor: minLength %d, want 1", s.MinLength)
	}
	if d := queryParam(t, events, "limit").Description; !strings.Contains(d, "Only with format=json") || !strings.Contains(d, "422") {
		t.Errorf("events limit does not say it is only for format=json: %q", d)
	}
	sse := events.Responses.Value("200").Value.Content["text/event-stream"]
	if sse == nil {
		t.Fatal("GET /v1/events documents no text/event-stream")
	}
	for _, frame := range []string{"one frame per event", "`id: ", "`event: ", "`data: ", "#/components/schemas/Event", "StreamError"} {
		if !strings.Contains(sse.Schema.Value.Description, frame) {
			t.Errorf("the event stream's description does not say %q", frame)
		}
	}
}
