package client

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// Retry defaults (see [WithRetry]).
const (
	DefaultMaxAttempts = 6
	DefaultRetryBase   = 50 * time.Millisecond
	DefaultRetryMax    = 2 * time.Second
)

// MaxResponseBytes is the largest response body the client reads. Larger
// answers fail with an error instead of being buffered.
const MaxResponseBytes = 8 << 20

// maxRetryAfter bounds how long one Retry-After may make the client wait.
const maxRetryAfter = time.Minute

// IdempotencyKeyHeader is the header of an idempotency key
// ([Command.IdempotencyKey]).
const IdempotencyKeyHeader = "Idempotency-Key"

const modulePath = "github.com/sandboxwich/sandboxwich"

// Client calls one Sandboxwich server. It is safe for concurrent use.
// Create it with [New].
type Client struct {
	base          string // scheme://host[/prefix], without a trailing slash
	hc            *http.Client
	token         string
	operatorToken string
	userAgent     string
	tlsConfig     *tls.Config
	customHTTP    bool // set by WithHTTPClient

	attempts  int
	retryBase time.Duration
	retryMax  time.Duration

	newClaimID func() (uuid.UUID, error)
	sleep      func(ctx context.Context, d time.Duration) error // tests record waits
}

// Option configures a Client.
type Option func(*Client)

// WithToken sets the bearer token sent with every request: a tenant token,
// or a worker token (sbw_wtok_…) for the worker calls.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithOperatorToken sets the operator token, sent in the
// x-sandboxwich-operator-token header next to a tenant token. [Client.Pools]
// needs it.
func WithOperatorToken(token string) Option { return func(c *Client) { c.operatorToken = token } }

// WithHTTPClient sets the HTTP client. The default has a clone of
// http.DefaultTransport, no overall timeout (bound calls with their
// context), and follows redirects only within the same host and scheme, so
// that the operator token never reaches another server; a redirect
// elsewhere is answered as the error it is.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc, c.customHTTP = hc, true }
}

// WithTLSConfig sets the TLS configuration of the default HTTP client, for
// example to trust a private CA. It has no effect together with
// WithHTTPClient, whose transport is used as it is.
func WithTLSConfig(cfg *tls.Config) Option { return func(c *Client) { c.tlsConfig = cfg } }

// WithRetry sets the retry policy of claims and reads: at most maxAttempts
// attempts in all (1 disables retries), waiting before retry n (n = 1, 2, …)
// a uniformly random time in [0, min(max, base·2ⁿ⁻¹)] ("full jitter"), or the
// answer's Retry-After (up to one minute) when it has one. The default is
// DefaultMaxAttempts, DefaultRetryBase, DefaultRetryMax.
func WithRetry(maxAttempts int, base, max time.Duration) Option {
	return func(c *Client) { c.attempts, c.retryBase, c.retryMax = maxAttempts, base, max }
}

// WithClaimIDs sets the source of the claim IDs [Client.Claim] generates when
// a request has none (default uuid.NewV7). Claim IDs must be unique per
// logical claim: a reused one returns the earlier claim's outcome.
func WithClaimIDs(newID func() (uuid.UUID, error)) Option {
	return func(c *Client) { c.newClaimID = newID }
}

// New returns a client of the server at baseURL, such as
// "http://127.0.0.1:3217". Every path is appended to it with its /v1 prefix,
// so a server mounted under a prefix is reached with "https://host/prefix".
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	switch {
	case err != nil:
		return nil, fmt.Errorf("client: invalid base URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("client: base URL %q must start with http:// or https://", baseURL)
	case u.Hostname() == "":
		return nil, fmt.Errorf("client: base URL %q has no host", baseURL)
	case u.User != nil:
		return nil, errors.New("client: base URL must not hold credentials; use WithToken")
	case strings.ContainsAny(baseURL, "?#"): // even an empty one: "http://h/#" would keep its slash

		return nil, fmt.Errorf("client: base URL %q must not have a query or fragment", baseURL)
	}
	c := &Client{
		base:       u.String(),
		userAgent:  "sandboxwich-go/" + moduleVersion(),
		attempts:   DefaultMaxAttempts,
		retryBase:  DefaultRetryBase,
		retryMax:   DefaultRetryMax,
		newClaimID: uuid.NewV7,
		sleep:      sleep,
	}
	for _, o := range opts {
		o(c)
	}
	if !c.customHTTP {
		c.hc = defaultHTTPClient(c.tlsConfig)
	}
	switch {
	case c.hc == nil:
		return nil, errors.New("client: WithHTTPClient(nil)")
	case c.newClaimID == nil:
		return nil, errors.New("client: WithClaimIDs(nil)")
	case c.attempts < 1 || c.retryBase < 0 || c.retryMax < c.retryBase:
		return nil, errors.New("client: WithRetry needs maxAttempts >= 1 and 0 <= base <= max")
	case strings.ContainsAny(c.token, "\r\n") || strings.ContainsAny(c.operatorToken, "\r\n"):
		return nil, errors.New("client: a token contains a line break")
	}
	return c, nil
}

// defaultHTTPClient is the HTTP client of a Client made without
// WithHTTPClient.
func defaultHTTPClient(tlsConfig *tls.Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if tlsConfig != nil {
		tr.TLSClientConfig = tlsConfig.Clone()
	}
	return &http.Client{Transport: tr, CheckRedirect: sameOriginRedirects}
}

// sameOriginRedirects follows at most 10 redirects, and only those to the
// scheme and host of the original request.
func sameOriginRedirects(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	if len(via) >= 10 || req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return http.ErrUseLastResponse
	}
	return nil
}

// String describes the client without its tokens.
func (c *Client) String() string { return "client.Client{" + c.base + "}" }

// GoString is String, for %#v.
func (c *Client) GoString() string { return c.String() }

// moduleVersion is the version of this module in the running binary.
func moduleVersion() string {
	v := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Path == modulePath {
			v = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				v = d.Version
			}
		}
	}
	if v == "" || v == "(devel)" {
		return "devel"
	}
	return v
}

// request is one API call.
type request struct {
	method string
	path   string // below /v1, starting with "/"
	body   any    // nil for no body
	// retry marks a call that may be repeated: a read, or a fenced claim.
	retry bool
	// accept is the Accept header; empty means application/json.
	accept string
	// idempotencyKey, when set, is sent as Idempotency-Key.
	idempotencyKey string
	// header holds extra request headers (Last-Event-ID).
	header http.Header
}

// do runs r and decodes a 2xx answer into out.
func (c *Client) do(ctx context.Context, r request, out any) error {
	var body []byte
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return fmt.Errorf("client: encode request: %w", err)
		}
		body = b
	}
	return c.send(ctx, r, body, out)
}

// send runs r with the given body bytes, which stay the same on every
// attempt, retrying when r.retry allows it.
func (c *Client) send(ctx context.Context, r request, body []byte, out any) error {
	return c.retry(ctx, r.retry, func() (bool, time.Duration, error) { return c.attempt(ctx, r, body, out) })
}

// retry runs attempt until it succeeds or fails for good; when again is
// set, a retryable failure is tried again after a backoff (or the
// answer's Retry-After) until the attempts run out or ctx ends.
func (c *Client) retry(ctx context.Context, again bool, attempt func() (retryable bool, wait time.Duration, err error)) error {
	attempts := 1
	if again {
		attempts = c.attempts
	}
	for n := 1; ; n++ {
		retryable, wait, err := attempt()
		if err == nil || !retryable {
			return err
		}
		if n >= attempts {
			if n > 1 {
				return fmt.Errorf("%w (gave up after %d attempts)", err, n)
			}
			return err
		}
		if wait <= 0 {
			wait = c.backoff(n)
		}
		if serr := c.sleep(ctx, wait); serr != nil {
			return fmt.Errorf("%w; last attempt: %w", serr, err)
		}
	}
}

// backoff is the full-jitter wait before retry n (n >= 1).
func (c *Client) backoff(n int) time.Duration {
	d := c.retryBase
	for i := 1; i < n && d < c.retryMax; i++ {
		d *= 2
	}
	d = min(d, c.retryMax)
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// sleep waits d or until ctx ends. It is the client's own copy of
// internal/ctxsleep.Sleep: the client imports nothing of the module beyond
// the wire types (DESIGN), and tests replace it (Client.sleep) anyway.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// attempt sends one request with a JSON body (nil for none) and decodes
// its 2xx answer into out. It reports whether a failure may be retried,
// and how long the server asked to wait (Retry-After), if it did.
func (c *Client) attempt(ctx context.Context, r request, body []byte, out any) (retryable bool, wait time.Duration, err error) {
	var rd io.Reader
	contentType := ""
	if body != nil {
		rd, contentType = bytes.NewReader(body), "application/json"
	}
	resp, retryable, wait, err := c.open(ctx, r, rd, contentType)
	if err != nil {
		return retryable, wait, err
	}
	defer resp.Body.Close()
	data, err := readAnswer(resp)
	if err != nil {
		return ctx.Err() == nil && !errors.Is(err, errTooLarge), 0, err
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return false, 0, fmt.Errorf("client: %s %s: decoding the %d response: %w", r.method, resp.Request.URL.Path, resp.StatusCode, err)
		}
	}
	return false, 0, nil
}

// errTooLarge marks an answer larger than MaxResponseBytes.
var errTooLarge = errors.New("response larger than " + strconv.Itoa(MaxResponseBytes) + " bytes")

// readAnswer reads a JSON answer of at most MaxResponseBytes.
func readAnswer(resp *http.Response) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("client: %s %s: reading the response: %w", resp.Request.Method, resp.Request.URL.Path, err)
	case len(data) > MaxResponseBytes:
		return nil, fmt.Errorf("client: %s %s: %w", resp.Request.Method, resp.Request.URL.Path, errTooLarge)
	}
	return data, nil
}

// open sends one request whose body (nil for none) has contentType and
// returns its 2xx response with the body unread; the caller closes it. A
// non-2xx answer is read and returned as an *Error. It reports whether a
// failure may be retried, and the answer's Retry-After.
func (c *Client) open(ctx context.Context, r request, body io.Reader, contentType string) (resp *http.Response, retryable bool, wait time.Duration, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, r.method, c.base+"/v1"+r.path, body)
	if err != nil {
		return nil, false, 0, fmt.Errorf("client: %w", err)
	}
	req.Header.Set("Accept", cmp.Or(r.accept, "application/json"))
	req.Header.Set("User-Agent", c.userAgent)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.operatorToken != "" {
		req.Header.Set(wire.OperatorHeader, c.operatorToken)
	}
	if r.idempotencyKey != "" {
		req.Header.Set(IdempotencyKeyHeader, r.idempotencyKey)
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	resp, err = c.hc.Do(req)
	if err != nil {
		// The request may or may not have reached the server.
		if cerr := ctx.Err(); cerr != nil {
			if !errors.Is(err, cerr) {
				err = fmt.Errorf("%w: %w", cerr, err)
			}
			return nil, false, 0, err
		}
		return nil, true, 0, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return resp, false, 0, nil
	}
	defer resp.Body.Close()
	data, err := readAnswer(resp)
	if err != nil && !errors.Is(err, errTooLarge) {
		return nil, ctx.Err() == nil, 0, err
	}
	e := apiError(resp, data)
	return nil, retryableStatus(e), time.Duration(e.RetryAfter) * time.Second, e
}

// apiError builds the *Error of a non-2xx answer.
func apiError(resp *http.Response, data []byte) *Error {
	e := &Error{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id")}
	var body wire.ErrorResponse
	if json.Unmarshal(data, &body) == nil && body.Code != "" {
		e.Code, e.Message = errcode.Code(body.Code), body.Message
	} else {
		// Not one of ours (a proxy's error page): never quote the body.
		e.Code, e.Message = errcode.ForStatus(resp.StatusCode), http.StatusText(resp.StatusCode)
	}
	e.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	return e
}

// retryAfter parses a Retry-After header (delay seconds or an HTTP date)
// into whole seconds, at most maxRetryAfter.
func retryAfter(v string, now time.Time) int {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	limit := int(maxRetryAfter / time.Second)
	if n, err := strconv.Atoi(v); err == nil {
		return min(max(n, 0), limit)
	}
	if t, err := http.ParseTime(v); err == nil {
		d := t.Sub(now)
		switch {
		case d <= 0:
			return 0
		case d >= maxRetryAfter:
			return limit
		}
		return min(int((d+time.Second-1)/time.Second), limit)
	}
	return 0
}

// retryableStatus reports whether an error answer means the request was not
// carried out, or carried out in a way that a fenced or read-only repeat
// resolves: 5xx (not 501, not a server without auth, not a cell out of
// space), 429, and a contended claim.
func retryableStatus(e *Error) bool {
	switch {
	case e.Status == http.StatusTooManyRequests:
		return true
	case e.Status == http.StatusConflict:
		return e.Code == errcode.ClaimContended
	case e.Status >= 500:
		return e.Status != http.StatusNotImplemented && e.Code != errcode.AuthNotConfigured && e.Code != errcode.InsufficientStorage
	}
	return false
}

// transient reports whether err, returned by a retrying call, may go away
// by itself: a transport failure or a retryable answer, not a refusal and
// not the caller's context.
func transient(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return retryableStatus(e)
	}
	_, ok := errors.AsType[*url.Error](err)
	return ok
}
