// Package webhook delivers the event log (CONTRACT §16) to the webhook
// endpoints of tenants: at least once, signed as Standard Webhooks sign,
// one deliverer per delivery across replicas.
//
// A [Deliverer] runs beside the plane on every replica with the same
// endpoints. Each pass it follows the log for every endpoint
// (store.Webhooks.EnqueueDeliveries: a delivery row per event, from the
// endpoint's cursor, in one transaction per endpoint on every replica),
// then leases the deliveries that are due (store.Webhooks.LeaseDeliveries: a
// lock with a TTL, so a deliverer that dies leaves its deliveries to
// another once the lock expires) and sends each: POST of the event JSON,
// headers webhook-id (the event id), webhook-timestamp and
// webhook-signature, 10 s timeout, redirects not followed. A 2xx answer
// delivers it; anything else is retried with exponential backoff (full
// jitter, doubling from 1 s up to an hour between attempts) for 24 hours
// and at most 20 attempts, then the delivery is failed. Receivers dedupe by
// webhook-id (client.WebhookVerifier checks the signature).
//
// An event is never in a log line or an error, nor is a secret; the
// body carries none (the log holds no attestation, digest or token).
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Endpoint is one webhook of a tenant.
type Endpoint struct {
	// TenantID is the tenant whose events it receives.
	TenantID string
	// URL is where deliveries are POSTed: https, or http to a loopback
	// address only.
	URL string
	// Types keeps events whose type starts with one of them ("cell.",
	// "lease.released"); none keeps every type of the tenant.
	Types []string
	// Secrets sign each delivery, one signature each (several during a
	// rotation). Load them with LoadSecretFile.
	Secrets []Secret
}

// ID is the endpoint's stable name in the database and in metrics: a hash
// of its tenant and URL, never the URL (which may hold a credential).
func (e Endpoint) ID() string {
	sum := sha256.Sum256([]byte(e.TenantID + "\x00" + e.URL))
	return "wh-" + hex.EncodeToString(sum[:6])
}

// Check reports what is wrong with the endpoint: no tenant, a URL that is
// neither https nor http to loopback, a type prefix that is not one, no
// secret.
func (e Endpoint) Check() error {
	if e.TenantID == "" {
		return errors.New("webhook: an endpoint needs a tenant_id")
	}
	u, err := url.Parse(e.URL)
	if err != nil || u.Host == "" || u.User != nil {
		return errors.New("webhook: the url must be an absolute http(s) URL without credentials")
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !loopback(u.Hostname()) {
			return errors.New("webhook: the url must be https, except to a loopback address")
		}
	default:
		return errors.New("webhook: the url must be https, except to a loopback address")
	}
	for _, t := range e.Types {
		if t == "" || strings.Trim(t, "abcdefghijklmnopqrstuvwxyz_.") != "" {
			return fmt.Errorf("webhook: type %q is not an event type or its prefix", t)
		}
	}
	if len(e.Secrets) == 0 {
		return errors.New("webhook: an endpoint needs a secret")
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Secret is a signing key, as "whsec_<base64>" decodes. Its String never
// shows it.
type Secret struct{ key []byte }

// String hides the key.
func (Secret) String() string { return "webhook.Secret(redacted)" }

// ParseSecret decodes "whsec_<base64 key>".
func ParseSecret(s string) (Secret, error) {
	b64, ok := strings.CutPrefix(strings.TrimSpace(s), "whsec_")
	key, err := base64.StdEncoding.DecodeString(b64)
	if !ok || err != nil || len(key) < 16 {
		return Secret{}, errors.New("webhook: a secret is whsec_ followed by the base64 of at least 16 bytes")
	}
	return Secret{key: key}, nil
}

// LoadSecretFile reads the secrets of a file: one "whsec_<base64>" a line
// (two during a rotation). The file must be a regular file that neither
// group nor others can access (mode 0600 or stricter).
func LoadSecretFile(path string) ([]Secret, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("webhook: secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("webhook: secret file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("webhook: secret file %s has mode %04o; fix it with: chmod 600 %s", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("webhook: secret file: %w", err)
	}
	var out []Secret
	for line := range strings.Lines(string(b)) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		s, err := ParseSecret(line)
		if err != nil {
			return nil, fmt.Errorf("webhook: secret file %s: %w", path, err)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("webhook: secret file %s holds no secret", path)
	}
	return out, nil
}

// Sign returns the webhook-signature header of a delivery: one
// "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>" per secret, space
// separated.
func Sign(secrets []Secret, id string, at time.Time, body []byte) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	sigs := make([]string, len(secrets))
	for i, s := range secrets {
		m := hmac.New(sha256.New, s.key)
		m.Write([]byte(id + "." + ts + "."))
		m.Write(body)
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
	}
	return strings.Join(sigs, " ")
}
