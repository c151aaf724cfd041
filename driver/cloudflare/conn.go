package cloudflare

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
)

// requestHeader names an exec request for its cancellation.
const requestHeader = "X-Sandboxwich-Request"

// agentTransport carries the agent protocol of one cell to the bridge: a
// request for http://agent/v1/<route> goes to
// <bridge>/v1/cells/<cell>/agent/v1/<route> with the bearer token and the
// cell's identity. A refusal the bridge itself decides (its
// X-Sandboxwich-Bridge-Error header) becomes an error of the request:
// cell_lost wraps driver.ErrCellLost, cell_not_found driver.ErrNotFound,
// 401 ErrUnauthorized. The agent's own answers, and the bridge's
// refusals in the agent's codes (fence_refused, not_active, expired,
// invalid_request), pass through for agent.Client to read; agent.Client
// wraps the transport's errors with %w, so errors.Is finds them.
type agentTransport struct {
	b        *bridge
	cellID   string
	identity string
}

// RoundTrip sends one agent request through the bridge.
// The request's body passes to the inner request, whose transport closes
// it (as RoundTrip must); it is closed here only when no request is made.
func (t *agentTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	closeBody := func() {
		if r.Body != nil {
			r.Body.Close()
		}
	}
	tok, err := readToken(t.b.tokenFile)
	if err != nil {
		closeBody()
		return nil, err
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		closeBody()
		return nil, fmt.Errorf("cloudflare: agent route %q", r.URL.Path)
	}
	u := *t.b.base
	u.Path = cellPath(t.cellID) + "/agent" + r.URL.Path
	u.RawQuery = r.URL.RawQuery
	var body io.Reader
	if r.Body != nil && r.Body != http.NoBody {
		body = r.Body
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), body)
	if err != nil {
		closeBody()
		return nil, err
	}
	out.ContentLength = r.ContentLength
	if ct := r.Header.Get("Content-Type"); ct != "" {
		out.Header.Set("Content-Type", ct)
	}
	out.Header.Set("Authorization", "Bearer "+tok)
	out.Header.Set(identityHeader, t.identity)
	// An exec ended early (its context, or the caller closing the answer
	// before its end) is cancelled at the bridge, which aborts the
	// container's request so that the agent kills the command: a dropped
	// connection does not travel through the Worker to the container.
	var cancel *execCancel
	if r.Method == http.MethodPost && r.URL.Path == "/v1/exec" {
		cancel = &execCancel{t: t, id: uuid.NewString()}
		out.Header.Set(requestHeader, cancel.id)
		cancel.stop = context.AfterFunc(r.Context(), cancel.send)
	}
	resp, err := t.b.hc.Do(out)
	if cancel != nil {
		switch {
		case err == nil && resp.StatusCode == http.StatusOK:
			resp.Body = &execBody{ReadCloser: resp.Body, c: cancel}
		case err != nil:
			// No answer: the exec may run at the agent. Cancel it (once:
			// AfterFunc may have sent it already, when the context ended).
			cancel.stop()
			cancel.send()
		default:
			cancel.stop() // a refusal: nothing runs
		}
	}
	if err != nil {
		return nil, scrub(err)
	}
	// 401 is the bridge's (or Cloudflare's edge's); a 403 is the agent's
	// file_access_denied unless the bridge marked it as its own.
	code := resp.Header.Get(bridgeErrorHeader)
	if resp.StatusCode == http.StatusUnauthorized || (resp.StatusCode == http.StatusForbidden && code != "") {
		drain(resp)
		return nil, ErrUnauthorized
	}
	if code != "" {
		e := refusal(resp)
		switch code {
		case "cell_lost":
			return nil, fmt.Errorf("cloudflare: cell %s: %w: %w", t.cellID, driver.ErrCellLost, e)
		case "cell_not_found":
			return nil, fmt.Errorf("cloudflare: cell %s: %w: %w", t.cellID, driver.ErrNotFound, e)
		}
		return nil, e
	}
	return resp, nil
}

// execCancel cancels one exec at the bridge, once.
type execCancel struct {
	t    *agentTransport
	id   string
	stop func() bool
	once sync.Once
}

// send asks the bridge to abort the exec. It runs detached from the
// request's context, which has ended.
func (c *execCancel) send() {
	c.once.Do(func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body, _ := json.Marshal(map[string]string{"request_id": c.id})
			resp, err := c.t.b.once(ctx, http.MethodPost, cellPath(c.t.cellID)+"/agent-cancel", http.Header{"Content-Type": {"application/json"}}, body)
			if err == nil {
				drain(resp)
			}
		}()
	})
}

// done ends the watch of a finished exec.
func (c *execCancel) done() { c.stop() }

// execBody watches an exec's answer: read to its end, the exec finished;
// closed before, it is cancelled.
type execBody struct {
	io.ReadCloser
	c   *execCancel
	eof bool
}

func (b *execBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof = true
		b.c.done()
	}
	return n, err
}

func (b *execBody) Close() error {
	if b.c.stop() && !b.eof {
		b.c.send()
	}
	return b.ReadCloser.Close()
}
