package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a webhook delivery, as Standard Webhooks names them
// (CONTRACT §16).
const (
	WebhookIDHeader        = "webhook-id"
	WebhookTimestampHeader = "webhook-timestamp"
	WebhookSignatureHeader = "webhook-signature"
)

// DefaultWebhookTolerance is how far a delivery's timestamp may be from
// the receiver's clock, either way, unless WebhookVerifier.Tolerance says
// otherwise.
const DefaultWebhookTolerance = 5 * time.Minute

// Errors of WebhookVerifier.Verify.
var (
	// ErrWebhookSignature: no signature of the delivery is one of the
	// verifier's keys' (or a header is missing or malformed).
	ErrWebhookSignature = errors.New("client: webhook signature does not verify")
	// ErrWebhookTimestamp: the delivery's timestamp is outside the
	// tolerance (a replay, or a clock far off).
	ErrWebhookTimestamp = errors.New("client: webhook timestamp outside the tolerance")
)

// WebhookVerifier checks the Standard Webhooks signature of a delivery:
// webhook-signature holds space-separated "v1,<base64 HMAC-SHA256(key,
// id.timestamp.body)>" signatures, one per secret the sender signs with
// (several during a rotation); one that matches a key of the verifier is
// enough. Receivers then dedupe by webhook-id: a delivery may come more than
// once. Create it with NewWebhookVerifier.
type WebhookVerifier struct {
	keys [][]byte
	// Tolerance bounds |now − webhook-timestamp| (default
	// DefaultWebhookTolerance).
	Tolerance time.Duration
	// Now is the receiver's clock (default time.Now).
	Now func() time.Time
}

// NewWebhookVerifier returns a verifier of the given secrets, each
// "whsec_<base64 key>" as the server's secret file holds it (the prefix
// may be left out). Pass the old and the new secret during a rotation.
func NewWebhookVerifier(secrets ...string) (*WebhookVerifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("client: a webhook verifier needs a secret")
	}
	v := &WebhookVerifier{Tolerance: DefaultWebhookTolerance, Now: time.Now}
	for i, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(s), "whsec_"))
		if err != nil || len(key) == 0 {
			return nil, fmt.Errorf("client: webhook secret %d is not whsec_<base64>", i+1)
		}
		v.keys = append(v.keys, key)
	}
	return v, nil
}

// Verify checks a delivery's headers and body: its timestamp within the
// tolerance (ErrWebhookTimestamp), then its signature (ErrWebhookSignature).
// It returns the delivery's webhook-id, the key to dedupe by.
func (v *WebhookVerifier) Verify(h http.Header, body []byte) (string, error) {
	id, ts, sigs := h.Get(WebhookIDHeader), h.Get(WebhookTimestampHeader), h.Get(WebhookSignatureHeader)
	if id == "" || ts == "" || sigs == "" {
		return "", fmt.Errorf("%w: missing %s, %s or %s", ErrWebhookSignature, WebhookIDHeader, WebhookTimestampHeader, WebhookSignatureHeader)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not Unix seconds", ErrWebhookTimestamp, WebhookTimestampHeader)
	}
	now, tol := v.Now(), v.Tolerance
	if tol <= 0 {
		tol = DefaultWebhookTolerance
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tol || d < -tol {
		return "", ErrWebhookTimestamp
	}
	for _, key := range v.keys {
		want := webhookMAC(key, id, ts, body)
		for _, sig := range strings.Fields(sigs) {
			version, b64, ok := strings.Cut(sig, ",")
			if !ok || version != "v1" {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err == nil && hmac.Equal(got, want) {
				return id, nil
			}
		}
	}
	return "", ErrWebhookSignature
}

// webhookMAC is HMAC-SHA256(key, id + "." + timestamp + "." + body).
func webhookMAC(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return m.Sum(nil)
}
