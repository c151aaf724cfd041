package cloudflare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Headers of the bridge protocol (bridge/src/errors.ts, bridge/src/cell.ts).
const (
	identityHeader    = "X-Sandboxwich-Identity"
	bridgeErrorHeader = "X-Sandboxwich-Bridge-Error"
)

// ErrUnauthorized marks a 401 or 403 from the bridge or the Cloudflare
// API: a configuration error (a wrong or revoked token), never retried.
var ErrUnauthorized = errors.New("cloudflare: the token was refused (401/403): check the token file and its permissions")

// BridgeError is a refusal of the bridge: its code and message, never
// anything of the request.
type BridgeError struct {
	Status  int
	Code    string
	Message string
}

// Error describes the refusal.
func (e *BridgeError) Error() string {
	return fmt.Sprintf("cloudflare bridge: HTTP %d: %s: %s", e.Status, e.Code, e.Message)
}

// bridge is the driver's client of the bridge Worker. The token is read
// from its file for every request (a rotated token is picked up), held
// only in the request's header, and never logged or put in an error.
type bridge struct {
	base      *url.URL
	tokenFile string
	hc        *http.Client
	// retries bounds the attempts of an idempotent request on 429 and 5xx.
	retries int
	backoff time.Duration
}

// newBridge checks the URL: https, or http to a loopback address only (a
// local workerd in tests and development).
func newBridge(raw, tokenFile string, hc *http.Client) (*bridge, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("cloudflare: bridge_url %q is not an https://host URL", raw)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !isLoopback(u.Hostname()) {
			return nil, fmt.Errorf("cloudflare: bridge_url %q: plain http is allowed only to a loopback address", raw)
		}
	default:
		return nil, fmt.Errorf("cloudflare: bridge_url %q is not an https://host URL", raw)
	}
	if tokenFile == "" {
		return nil, errors.New("cloudflare: bridge_token_file is required")
	}
	if _, err := readToken(tokenFile); err != nil {
		return nil, err
	}
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
		}}
	}
	u.Path = ""
	return &bridge{base: u, tokenFile: tokenFile, hc: hc, retries: 5, backoff: 200 * time.Millisecond}, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// readToken reads a token file: one line, no whitespace inside, readable
// by its owner only (mode 0600 or stricter). The error names the file,
// never its content.
func readToken(path string) (string, error) {
	b, err := readSmallFile(path, 4096, true)
	if err != nil {
		return "", fmt.Errorf("cloudflare: token file %s: %w", path, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" || strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("cloudflare: token file %s does not hold one token", path)
	}
	return t, nil
}

// request makes one request to path. An idempotent request is retried on
// 429 and 5xx with exponential backoff and jitter (Retry-After honoured),
// within ctx; 401 and 403 are ErrUnauthorized at once.
func (b *bridge) request(ctx context.Context, method, path string, hdr http.Header, body []byte, idempotent bool) (*http.Response, error) {
	delay := b.backoff
	for attempt := 0; ; attempt++ {
		resp, err := b.once(ctx, method, path, hdr, body)
		if err != nil {
			return nil, err
		}
		retry := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented
		if !retry || !idempotent || attempt >= b.retries {
			return resp, nil
		}
		wait := delay + rand.N(delay/2+1)
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 && s <= 60 {
			wait = time.Duration(s) * time.Second
		}
		drain(resp)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cloudflare bridge: %s %s: %w (after HTTP %d)", method, path, ctx.Err(), resp.StatusCode)
		case <-time.After(wait):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (b *bridge) once(ctx context.Context, method, path string, hdr http.Header, body []byte) (*http.Response, error) {
	tok, err := readToken(b.tokenFile)
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.base.String()+path, rd)
	if err != nil {
		return nil, fmt.Errorf("cloudflare bridge: %w", err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := b.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cloudflare bridge: %s %s: %w", method, path, scrub(err))
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		drain(resp)
		return nil, fmt.Errorf("cloudflare bridge: %s %s: %w", method, path, ErrUnauthorized)
	}
	return resp, nil
}

// scrub drops the request URL from a transport error (it carries no
// token, but keep errors short and uniform).
func scrub(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// refusal reads a non-success answer as a *BridgeError.
func refusal(resp *http.Response) error {
	defer drain(resp)
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &e) != nil || e.Code == "" {
		return &BridgeError{Status: resp.StatusCode, Code: "unknown", Message: strings.TrimSpace(string(b[:min(len(b), 200)]))}
	}
	return &BridgeError{Status: resp.StatusCode, Code: e.Code, Message: e.Message}
}

// call makes an idempotent JSON request and decodes a 2xx answer into
// out; any other answer is a *BridgeError.
func (b *bridge) call(ctx context.Context, method, path string, hdr http.Header, in, out any) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("cloudflare bridge: %w", err)
		}
	}
	resp, err := b.request(ctx, method, path, hdr, body, true)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return refusal(resp)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(out); err != nil {
		return fmt.Errorf("cloudflare bridge: %s %s: reading the answer: %w", method, path, err)
	}
	return nil
}

// bridgeInfo is GET /v1/bridge.
type bridgeInfo struct {
	BridgeVersion  string `json:"bridge_version"`
	ContainerClass string `json:"container_class"`
	Image          string `json:"image"`
	InstanceType   string `json:"instance_type"`
}

// agentReport is the agent's status as the bridge relays it (a report).
type agentReport struct {
	State       string `json:"state"`
	Activations int    `json:"activations"`
	CellID      string `json:"cell_id"`
	Digest      string `json:"digest"`
}

// cellStatus is GET /v1/cells/:id and the answer of a create.
type cellStatus struct {
	CellID         string       `json:"cell_id"`
	Identity       string       `json:"identity"`
	Pool           string       `json:"pool"`
	State          string       `json:"state"`
	EndedReason    *string      `json:"ended_reason"`
	Started        bool         `json:"started"`
	Image          string       `json:"image"`
	InstanceType   string       `json:"instance_type"`
	ContainerClass string       `json:"container_class"`
	Backend        string       `json:"backend"`
	BridgeVersion  string       `json:"bridge_version"`
	Ready          bool         `json:"ready"`
	Agent          *agentReport `json:"agent"`
}

func cellPath(id string) string { return "/v1/cells/" + url.PathEscape(id) }

func queryEscape(s string) string { return url.QueryEscape(s) }
