package client

// Fuzz targets for what the client parses from a server it does not
// control: Retry-After, error bodies, claim answers, and its base URL.

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// FuzzRetryAfter checks that any Retry-After header becomes a wait of 0 to
// 60 seconds: delay-seconds clamped into that range, an HTTP date rounded up
// from now, anything else 0. A server can never make the client wait
// longer than a minute, or a negative time. (Seed "Fri, 01 Aug 7000 …"
// fails today: a date more than 292 years ahead saturates time.Duration and
// the rounding overflows to a negative Retry-After.)
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"1", "0", "-5", "60", "61", "99999999999999999999", " 7 ", "1.5", "+3", "",
		"Fri, 07 Aug 2026 12:00:30 GMT", "Fri, 07 Aug 2026 11:00:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMT",
		"Friday, 07-Aug-26 12:00:10 GMT", "Fri Aug  7 12:00:05 2026", "garbage",
		"Fri, 01 Aug 7000 00:00:00 GMT"} {
		f.Add(s)
	}
	now := time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		got := retryAfter(v, now)
		if got < 0 || got > 60 {
			t.Fatalf("retryAfter(%q) = %d, outside [0, 60]", v, got)
		}
		s := strings.TrimSpace(v)
		if n, err := strconv.Atoi(s); err == nil {
			if want := min(max(n, 0), 60); got != want {
				t.Fatalf("retryAfter(%q) = %d, want %d", v, got, want)
			}
			return
		}
		if d, err := http.ParseTime(s); err == nil {
			want := 0
			if secs := d.Sub(now); secs > 0 {
				want = int(math.Min(math.Ceil(secs.Seconds()), 60))
			}
			if got != want {
				t.Fatalf("retryAfter(%q) = %d, want %d", v, got, want)
			}
			return
		}
		if got != 0 {
			t.Fatalf("retryAfter(%q) = %d for a value that is neither seconds nor a date", v, got)
		}
	})
}

// FuzzErrorResponse feeds any status, body and Retry-After to the error
// decoding of the client. The result always has a code; a body that is the
// server's envelope gives its code and message; any other body (a proxy's
// page, say) is never quoted, so the error text cannot carry what a hostile
// or confused middlebox put there; and only 429, 5xx (not 501, not
// auth_not_configured) and sterile_cell_claim_contended are retried.
func FuzzErrorResponse(f *testing.F) {
	f.Add(409, []byte(`{"ok":false,"code":"conflict","message":"no"}`), "")
	f.Add(409, []byte(`{"ok":false,"code":"sterile_cell_claim_contended","message":"retry"}`), "2")
	f.Add(502, []byte(`<html>upstream secret-proxy-page</html>`), "")
	f.Add(503, []byte(`{"code":""}`), "120")
	f.Add(500, []byte(`{"ok":false,"code":"auth_not_configured","message":"x"}`), "")
	f.Add(501, []byte(`{"ok":false,"code":"exec_unsupported","message":"x"}`), "")
	f.Add(429, []byte(``), "Fri, 07 Aug 2026 12:00:30 GMT")
	f.Add(418, []byte(`null`), "")
	f.Add(404, []byte(`{"ok":false,"code":"not_found","message":"x","code":"conflict"}`), "")
	f.Fuzz(func(t *testing.T, status int, body []byte, ra string) {
		status = 400 + (status%200+200)%200 // 400 … 599
		resp := &http.Response{StatusCode: status, Header: http.Header{}}
		resp.Header.Set("Retry-After", ra)
		e := apiError(resp, body)
		if e.Code == "" || e.Status != status {
			t.Fatalf("error %+v", e)
		}
		if e.RetryAfter < 0 || e.RetryAfter > 60 {
			t.Fatalf("RetryAfter %d", e.RetryAfter)
		}
		var env wire.ErrorResponse
		if json.Unmarshal(body, &env) == nil && env.Code != "" {
			if e.Code != errcode.Code(env.Code) || e.Message != env.Message {
				t.Fatalf("envelope %s decoded as %+v", body, e)
			}
		} else {
			if e.Code != errcode.ForStatus(status) || e.Message != http.StatusText(status) {
				t.Fatalf("foreign body decoded as %+v", e)
			}
			if len(body) >= 8 && !strings.Contains(http.StatusText(status)+string(e.Code), string(body)) &&
				strings.Contains(e.Error(), string(body)) {
				t.Fatalf("error text %q quotes the body", e.Error())
			}
		}
		// 501, auth_not_configured and insufficient_storage are definite
		// answers: repeating the request cannot change them.
		want := status == 429 || (status >= 500 && status != 501 && e.Code != errcode.AuthNotConfigured && e.Code != errcode.InsufficientStorage) ||
			(status == 409 && e.Code == errcode.ClaimContended)
		if retryableStatus(e) != want {
			t.Fatalf("retryable(%d %s) = %v", status, e.Code, !want)
		}
		if !strings.Contains(e.Error(), string(e.Code)) {
			t.Fatalf("Error() %q lacks the code", e.Error())
		}
	})
}

// FuzzClaimResponse answers a claim with any 200 body. The client either
// fails, or returns an empty claim, or a lease with its attestation; it
// never returns a lease without one, and its String never shows it.
func FuzzClaimResponse(f *testing.F) {
	f.Add([]byte(`{"ok":true,"lease":null,"lease_attestation":null}`))
	f.Add([]byte(`{"ok":true,"lease":{"lease_id":"01890a5d-ac96-774b-bcce-b302099a8057","cell_id":"01890a5d-ac96-774b-bcce-b302099a8058","generation":2,"expires_at":"2026-08-07T12:00:00Z"},"lease_attestation":"swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk"}`))
	f.Add([]byte(`{"ok":true,"lease":{"lease_id":"01890a5d-ac96-774b-bcce-b302099a8057"},"lease_attestation":null}`))
	f.Add([]byte(`{"ok":true,"lease":{},"lease_attestation":""}`))
	f.Add([]byte(`{"ok":true,"lease":{"expires_at":"10000-01-01T00:00:00Z"},"lease_attestation":"swla1_x"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(``))
	var mu sync.Mutex
	var answer []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		b := answer
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	f.Cleanup(srv.Close)
	c, err := New(srv.URL, WithToken("tok"), WithRetry(1, 0, 0))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		mu.Lock()
		answer = body
		mu.Unlock()
		cl, err := c.Claim(context.Background(), wire.ClaimRequest{})
		if err != nil {
			return
		}
		if cl.Lease != nil && cl.Attestation() == "" {
			t.Fatalf("lease without attestation from %s", body)
		}
		if cl.Lease == nil && cl.Attestation() != "" {
			t.Fatal("attestation without lease")
		}
		if a := cl.Attestation(); len(a) >= 4 && strings.Contains(cl.String(), a) {
			t.Fatalf("String shows the attestation: %s", cl.String())
		}
	})
}

// FuzzBaseURL checks client.New on any base URL: an accepted one is
// http(s), has a host name, no credentials, no query or fragment, and every
// request goes to that host. (Seed "http://:" fails today: New accepts a
// base URL without a host name, and every call then fails with "no Host in
// request URL".)
func FuzzBaseURL(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:3217", "https://h/prefix/", "ftp://h", "http://user:pw@h", "http://h?x=1",
		"http://h#f", "http:///x", "//h", "h", "", "http://[::1]:80", "http://h/%zz", "HTTP://H", "http://h\x00",
		"http://:", "http://:8080", "http://0:", "http://0/#", "http://h/?"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := New(s)
		if err != nil {
			return
		}
		u, err := url.Parse(c.base)
		if err != nil {
			t.Fatalf("base %q does not parse: %v", c.base, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			t.Fatalf("New(%q) accepted base %q", s, c.base)
		}
		req, err := http.NewRequest("GET", c.base+"/v1/sterile-cells/claim", nil)
		if err == nil && (req.URL.Hostname() != u.Hostname() || req.URL.Port() != u.Port()) {
			t.Fatalf("requests of %q go to %q", s, req.URL.Host)
		}
		if strings.HasSuffix(c.base, "/") && c.base != strings.TrimRight(c.base, "/") {
			t.Fatalf("base %q keeps a trailing slash", c.base)
		}
	})
}
