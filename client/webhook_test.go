package client_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
)

// The test vector of the Standard Webhooks specification
// (github.com/standard-webhooks/standard-webhooks, libraries/go
// webhook_test.go: TestWebhookSign and TestWebhook).
const (
	swSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swMsgID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swTimestamp = 1614265330
	swPayload   = `{"test": 2432232314}`
	swSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	swBadSig    = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
)

func swHeader(ts int64, sig string) http.Header {
	h := http.Header{}
	h.Set(client.WebhookIDHeader, swMsgID)
	h.Set(client.WebhookTimestampHeader, strconv.FormatInt(ts, 10))
	h.Set(client.WebhookSignatureHeader, sig)
	return h
}

func TestWebhookVerifierVectors(t *testing.T) {
	at := time.Unix(swTimestamp, 0)
	for _, secret := range []string{swSecret, strings.TrimPrefix(swSecret, "whsec_")} {
		v, err := client.NewWebhookVerifier(secret)
		if err != nil {
			t.Fatal(err)
		}
		v.Now = func() time.Time { return at }
		for _, tc := range []struct {
			name string
			h    http.Header
			body string
			want error
		}{
			{"valid", swHeader(swTimestamp, swSignature), swPayload, nil},
			{"multi-signature", swHeader(swTimestamp, swBadSig+" v2,"+swBadSig[3:]+" "+swSignature+" "+swBadSig), swPayload, nil},
			{"bad signature", swHeader(swTimestamp, swBadSig), swPayload, client.ErrWebhookSignature},
			{"other body", swHeader(swTimestamp, swSignature), swPayload + " ", client.ErrWebhookSignature},
			{"v2 only", swHeader(swTimestamp, "v2,"+swSignature[3:]), swPayload, client.ErrWebhookSignature},
			{"old", swHeader(swTimestamp-301, swSignature), swPayload, client.ErrWebhookTimestamp},
			{"new", swHeader(swTimestamp+301, swSignature), swPayload, client.ErrWebhookTimestamp},
			{"no signature", swHeader(swTimestamp, ""), swPayload, client.ErrWebhookSignature},
			{"bad timestamp", func() http.Header {
				h := swHeader(swTimestamp, swSignature)
				h.Set(client.WebhookTimestampHeader, "x")
				return h
			}(),
				swPayload, client.ErrWebhookTimestamp},
		} {
			id, err := v.Verify(tc.h, []byte(tc.body))
			if !errors.Is(err, tc.want) || (err == nil && id != swMsgID) {
				t.Errorf("%s (%s): Verify = %q, %v; want %v", tc.name, secret[:6], id, err, tc.want)
			}
		}
	}
	// The signature is over the timestamp too: the vector within the
	// tolerance of a later clock still verifies, shifted it does not.
	v, _ := client.NewWebhookVerifier(swSecret)
	v.Now = func() time.Time { return at.Add(299 * time.Second) }
	if _, err := v.Verify(swHeader(swTimestamp, swSignature), []byte(swPayload)); err != nil {
		t.Errorf("within tolerance: %v", err)
	}
	if _, err := v.Verify(swHeader(swTimestamp+1, swSignature), []byte(swPayload)); !errors.Is(err, client.ErrWebhookSignature) {
		t.Errorf("another timestamp: %v", err)
	}
	// Rotation: a verifier of two secrets accepts either's signature.
	two, err := client.NewWebhookVerifier("whsec_"+"b3RoZXJrZXk=", swSecret)
	if err != nil {
		t.Fatal(err)
	}
	two.Now = func() time.Time { return at }
	if _, err := two.Verify(swHeader(swTimestamp, swSignature), []byte(swPayload)); err != nil {
		t.Errorf("rotation: %v", err)
	}
	for _, bad := range []string{"", "whsec_", "whsec_!!!"} {
		if _, err := client.NewWebhookVerifier(bad); err == nil {
			t.Errorf("NewWebhookVerifier(%q) succeeded", bad)
		}
	}
}
