package wire_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/wire"
)

var wireTimeShape = regexp.MustCompile(`\A"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3}|\.\d{6}|\.\d{9})?Z"\z`)

// FuzzWireTime decodes arbitrary JSON as a wire.Time. Whatever is accepted
// is exactly what time.Parse accepts as RFC 3339; it is held in UTC; it
// encodes in the canonical response form of CONTRACT §1 (UTC, "Z", a 0, 3,
// 6 or 9 digit fraction); and parse → format → parse is stable: the second
// decode gives the same instant and encodes to the same bytes.
func FuzzWireTime(f *testing.F) {
	for _, s := range []string{
		`"2026-08-07T12:00:00Z"`, `"2026-08-07T12:00:00.123456789Z"`, `"2026-08-07T12:00:00.1+02:00"`,
		`"2026-08-07T12:00:00.100000-00:30"`, `"2026-08-07t12:00:00z"`, `"2026-08-07 12:00:00Z"`,
		`"2026-02-30T12:00:00Z"`, `"2026-08-07T24:00:00Z"`, `"2026-08-07T12:00:60Z"`, `"0000-01-01T00:00:00Z"`,
		`"9999-12-31T23:59:59.999999999Z"`, `"9999-12-31T23:59:59-23:59"`, `"0000-01-01T00:00:00+23:59"`,
		`1786104000`, `null`, `""`, `"2026-08-07T12:00:00"`, `"2026-08-07T12:00:00.Z"`, `"2026-08-07T12:00:00,5Z"`,
		`"\u0032026-08-07T12:00:00Z"`, `{"t":1}`, `["2026-08-07T12:00:00Z"]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var wt wire.Time
		err := json.Unmarshal(b, &wt)
		var s string
		isString := json.Unmarshal(b, &s) == nil
		var parseErr error
		if isString {
			var v time.Time
			if v, parseErr = time.Parse(time.RFC3339Nano, s); parseErr == nil {
				if y := v.UTC().Year(); y < 0 || y > 9999 {
					parseErr = errors.New("no RFC 3339 form in UTC")
				}
			}
		}
		if (err == nil) != (isString && parseErr == nil) {
			t.Fatalf("wire.Time on %q: %v, but RFC 3339 in UTC: string %v, %v", b, err, isString, parseErr)
		}
		if err != nil {
			return
		}
		if wt.Location() != time.UTC {
			t.Fatalf("decoded %q into zone %v, want UTC", b, wt.Location())
		}
		out, err := json.Marshal(wt)
		if err != nil {
			t.Fatal(err)
		}
		if !wireTimeShape.Match(out) {
			t.Fatalf("%q encodes as %s: not the canonical response form", b, out)
		}
		var again wire.Time
		if err := json.Unmarshal(out, &again); err != nil {
			t.Fatalf("%q encodes as %s, which does not decode: %v", b, out, err)
		}
		if !again.Equal(wt.Time) {
			t.Fatalf("%q → %s → %v: the instant changed from %v", b, out, again.Time, wt.Time)
		}
		out2, _ := json.Marshal(again)
		if string(out2) != string(out) {
			t.Fatalf("format is not stable: %s then %s", out, out2)
		}
	})
}

// FuzzLeaseJSON decodes arbitrary JSON as the lease object of claim and
// validate responses (what the Go client reads) and checks that a decoded
// lease encodes and decodes back to the same value: UUIDs lowercase and
// hyphenated, expires_at canonical.
func FuzzLeaseJSON(f *testing.F) {
	f.Add([]byte(`{"lease_id":"01890a5d-ac96-774b-bcce-b302099a8057","cell_id":"{01890A5D-AC96-774B-BCCE-B302099A8058}",` +
		`"generation":2,"release":{"release_set_id":"r","runtime_class":"kata_microvm","policy_digest":"a","signature":"s"},` +
		`"organization_id":"o","workspace_id":"w","thread_id":"t","runner_session_id":"s","expires_at":"2026-08-07T12:00:00.5+01:00"}`))
	f.Add([]byte(`{"lease_id":"urn:uuid:01890a5d-ac96-774b-bcce-b302099a8057","generation":-1}`))
	f.Add([]byte(`{"lease_id":"01890a5dac96774bbcceb302099a8057","expires_at":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l wire.Lease
		if json.Unmarshal(b, &l) != nil {
			return
		}
		if l.ExpiresAt.Year() > 9999 || l.ExpiresAt.Year() < 0 {
			return // outside RFC 3339; FuzzWireTime covers the bounds
		}
		out, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		var back wire.Lease
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("%s does not decode: %v", out, err)
		}
		if back.LeaseID != l.LeaseID || back.CellID != l.CellID || back.Generation != l.Generation ||
			back.Release != l.Release || back.Binding != l.Binding || !back.ExpiresAt.Equal(l.ExpiresAt.Time) {
			t.Fatalf("round trip changed the lease: %+v → %s → %+v", l, out, back)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"lease_id", "cell_id"} {
			s, _ := m[k].(string)
			if id, err := uuid.Parse(s); err != nil || id.String() != s {
				t.Fatalf("%s = %q is not a lowercase hyphenated UUID", k, s)
			}
		}
	})
}
