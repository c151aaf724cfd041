package k8stest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// PatchOp is one JSON Patch (RFC 6902) operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Mutator decides the patch for one admitted Pod; nil admits it unchanged.
type Mutator func(pod *corev1.Pod) []PatchOp

// StripRuntimeClass removes spec.runtimeClassName from every Pod.
func StripRuntimeClass(pod *corev1.Pod) []PatchOp {
	if pod.Spec.RuntimeClassName == nil {
		return nil
	}
	return []PatchOp{{Op: "remove", Path: "/spec/runtimeClassName"}}
}

// SetRuntimeClass returns a Mutator that sets spec.runtimeClassName to
// name on every Pod.
func SetRuntimeClass(name string) Mutator {
	return func(pod *corev1.Pod) []PatchOp {
		return []PatchOp{{Op: "add", Path: "/spec/runtimeClassName", Value: name}}
	}
}

// Webhook is a mutating admission webhook served over HTTPS on loopback
// with its own CA and registered with the API server for Pod creation in
// one namespace.
type Webhook struct {
	// Requests counts the admission reviews served.
	Requests atomic.Int64
	probes   atomic.Int64
}

const probePrefix = "k8stest-webhook-probe-"

// MutatingWebhook serves mutate for Pods created in namespace and
// registers it (failurePolicy Fail, sideEffects None). It returns once the
// API server applies it: a dry-run probe Pod reached the webhook. At
// cleanup the registration is deleted and the server closed.
func (e *Env) MutatingWebhook(tb testing.TB, namespace string, mutate Mutator) *Webhook {
	tb.Helper()
	wh := &Webhook{}
	caPEM, cert, err := selfSignedServing()
	if err != nil {
		tb.Fatalf("k8stest: webhook certificates: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("k8stest: webhook listener: %v", err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { wh.serve(w, r, mutate) }),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()

	name := "k8stest-" + namespace
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	url := "https://" + ln.Addr().String() + "/mutate"
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pods.k8stest.sandboxwich.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": namespace}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr(int32(10)),
		}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	whs := e.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := whs.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		_ = srv.Close()
		tb.Fatalf("k8stest: registering webhook: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := whs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			tb.Errorf("k8stest: deleting webhook %s: %v", name, err)
		}
		_ = srv.Close()
	})
	// The API server picks configurations up asynchronously: probe with
	// dry-run creations until one reaches the webhook.
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: probePrefix},
		Spec: corev1.PodSpec{
			RuntimeClassName: ptr("runc"),
			Containers:       []corev1.Container{{Name: "probe", Image: "probe.invalid/probe:1"}},
		},
	}
	err = wait.PollUntilContextCancel(ctx, 25*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().Pods(namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			tb.Logf("k8stest: webhook probe: %v", err)
		}
		return wh.probes.Load() > 0, nil
	})
	if err != nil {
		tb.Fatalf("k8stest: webhook %s never applied: %v", name, err)
	}
	return wh
}

func (wh *Webhook) serve(w http.ResponseWriter, r *http.Request, mutate Mutator) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, "bad admission review", http.StatusBadRequest)
		return
	}
	var pod corev1.Pod
	if err := json.Unmarshal(review.Request.Object.Raw, &pod); err != nil {
		http.Error(w, "bad pod", http.StatusBadRequest)
		return
	}
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	if strings.HasPrefix(pod.GenerateName, probePrefix) {
		wh.probes.Add(1)
	} else {
		wh.Requests.Add(1)
		if ops := mutate(&pod); len(ops) > 0 {
			patch, err := json.Marshal(ops)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = patch, &pt
		}
	}
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(review)
}

// selfSignedServing makes a CA and a serving certificate for 127.0.0.1
// signed by it.
func selfSignedServing() (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "k8stest webhook CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, cert, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func ptr[T any](v T) *T { return &v }
