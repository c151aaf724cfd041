package kubernetes

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/lease"
)

// The per-cell PKI of the agent's channel (CONTRACT §13) lives in two
// Secrets named after the cell, both immutable and carrying the Pod's
// ownership labels:
//
//   - AgentSecretName: the agent's server leaf, its key and the CA
//     certificate, mounted read-only into the cell;
//   - ControlSecretName: the control side's client leaf, its key, the CA
//     certificate and the CA key, never mounted into any Pod; only the
//     plane's service account may read it (deploy/kubernetes/rbac.yaml),
//     and a restarted plane reads it back from the API server. It is
//     never in the plane's database.
//
// Provision creates the control Secret first: a retry of a provisioning
// whose answer was lost finds it and adopts its CA (issuing the agent's
// leaf again from the CA key if the agent Secret was never created), so a
// cell never has two CAs. Destroy deletes both after the Pod is gone and
// proves them absent.

// Keys of the Secrets' data.
const (
	SecretCACert  = "ca.crt"
	SecretCAKey   = "ca.key"
	SecretTLSCert = "tls.crt"
	SecretTLSKey  = "tls.key"
)

// AgentSecretName is the Secret mounted into a cell: the agent's leaf.
func AgentSecretName(cellID uuid.UUID) string { return PodName(cellID) + "-agent" }

// ControlSecretName is the Secret of the cell's control side: the client
// leaf and the CA key, never mounted into a Pod.
func ControlSecretName(cellID uuid.UUID) string { return PodName(cellID) + "-control" }

func (p *Provider) secrets() typedcorev1.SecretInterface {
	return p.client.CoreV1().Secrets(p.cfg.Namespace)
}

// secret is one of a cell's immutable Secrets.
func (p *Provider) secret(name string, cellID uuid.UUID, class lease.RuntimeClass, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.cfg.Namespace, Labels: p.podLabels(cellID, class)},
		Immutable:  ptr(true),
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
}

// ensureSecrets creates the cell's two Secrets, or adopts those an earlier
// call created.
func (p *Provider) ensureSecrets(ctx context.Context, cellID uuid.UUID, class lease.RuntimeClass) error {
	now := time.Now()
	pki, err := agent.NewCellPKI(cellID.String(), now, p.cfg.CertValidity)
	if err != nil {
		return err
	}
	ctlName, agName := ControlSecretName(cellID), AgentSecretName(cellID)
	err = p.createSecret(ctx, cellID, p.secret(ctlName, cellID, class, map[string][]byte{
		SecretCACert: pki.CACert, SecretCAKey: pki.CAKey, SecretTLSCert: pki.ClientCert, SecretTLSKey: pki.ClientKey,
	}))
	adopted := false
	switch {
	case err == nil:
	case apierrors.IsAlreadyExists(err):
		// A retry: adopt the CA of the earlier call.
		got, err := p.ownedSecret(ctx, ctlName, cellID)
		if err != nil {
			return err
		}
		pki = &agent.CellPKI{CACert: got.Data[SecretCACert], CAKey: got.Data[SecretCAKey],
			ClientCert: got.Data[SecretTLSCert], ClientKey: got.Data[SecretTLSKey]}
		if _, err := pki.ClientConfig(cellID.String()); err != nil {
			return fmt.Errorf("secret %s: %w", ctlName, err)
		}
		if err := pki.IssueServer(cellID.String(), now, p.cfg.CertValidity); err != nil {
			return err
		}
		adopted = true
	default:
		return fmt.Errorf("secret %s: create: %w", ctlName, err)
	}
	err = p.createSecret(ctx, cellID, p.secret(agName, cellID, class, map[string][]byte{
		SecretCACert: pki.CACert, SecretTLSCert: pki.ServerCert, SecretTLSKey: pki.ServerKey,
	}))
	switch {
	case err == nil:
	case apierrors.IsAlreadyExists(err):
		got, err := p.ownedSecret(ctx, agName, cellID)
		if err != nil {
			return err
		}
		if !bytes.Equal(got.Data[SecretCACert], pki.CACert) {
			return fmt.Errorf("secret %s holds another CA than secret %s", agName, ctlName)
		}
	default:
		return fmt.Errorf("secret %s: create: %w", agName, err)
	}
	p.log.Info("cell secrets in place", "cell_id", cellID, "adopted", adopted)
	return nil
}

// createSecret creates one of cell's Secrets, never abandoning the request
// mid-flight (see package inflight).
func (p *Provider) createSecret(ctx context.Context, cellID uuid.UUID, s *corev1.Secret) error {
	return p.creates.Do(ctx, cellID, func(ctx context.Context) error {
		_, err := p.secrets().Create(ctx, s, metav1.CreateOptions{})
		return err
	})
}

// ownedSecret reads a cell's Secret and requires this pool's ownership
// labels on it.
func (p *Provider) ownedSecret(ctx context.Context, name string, cellID uuid.UUID) (*corev1.Secret, error) {
	s, err := p.secrets().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	if err := p.ownedLabels(s.Labels, cellID); err != nil {
		return nil, fmt.Errorf("secret %s/%s (uid %s): %w", s.Namespace, s.Name, s.UID, err)
	}
	return s, nil
}

// controlTLS reads the cell's control Secret back from the API server and
// returns the client's TLS configuration for the cell's agent.
func (p *Provider) controlTLS(ctx context.Context, cellID uuid.UUID) (*tls.Config, error) {
	s, err := p.ownedSecret(ctx, ControlSecretName(cellID), cellID)
	if err != nil {
		return nil, err
	}
	pki := &agent.CellPKI{CACert: s.Data[SecretCACert], ClientCert: s.Data[SecretTLSCert], ClientKey: s.Data[SecretTLSKey]}
	return pki.ClientConfig(cellID.String())
}

// destroySecrets deletes the cell's Secrets that carry this pool's
// ownership labels (each with a UID precondition) and reads them back
// until the API server says they do not exist. A Secret without those
// labels is left alone and reported, as is one still present when ctx
// ends.
func (p *Provider) destroySecrets(ctx context.Context, cellID uuid.UUID) error {
	for _, name := range []string{AgentSecretName(cellID), ControlSecretName(cellID)} {
		s, err := p.secrets().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("reading secret %s: %v", name, err)
		}
		if err := p.ownedLabels(s.Labels, cellID); err != nil {
			return fmt.Errorf("secret %s: %v; not deleting it", name, err)
		}
		uid := s.UID
		err = p.secrets().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting secret %s: %v", name, err)
		}
		if err := p.waitSecretGone(ctx, name, uid); err != nil {
			return err
		}
	}
	return nil
}

// waitSecretGone polls until the Secret name with uid is absent, or ctx
// ends.
func (p *Provider) waitSecretGone(ctx context.Context, name string, uid types.UID) error {
	delay := 20 * time.Millisecond
	for {
		s, err := p.secrets().Get(ctx, name, metav1.GetOptions{})
		last := "secret still exists"
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			last = err.Error()
		case s.UID != uid:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("absence of secret %s (uid %s) not confirmed: %s (%v)", name, uid, last, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// listSecrets adds to objs a cell for every Secret selected by sel whose
// cell has no object in objs yet (identity "": whatever backs the cell).
func (p *Provider) listSecrets(ctx context.Context, sel string, objs []driver.Object) ([]driver.Object, error) {
	seen := make(map[uuid.UUID]bool, len(objs))
	for _, o := range objs {
		seen[o.CellID] = true
	}
	opts := metav1.ListOptions{LabelSelector: sel}
	for {
		list, err := p.secrets().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: list secrets: %w", err)
		}
		for _, s := range list.Items {
			id, err := uuid.Parse(s.Labels[LabelCellID])
			if err != nil || (s.Name != AgentSecretName(id) && s.Name != ControlSecretName(id)) {
				p.log.Warn("secret with ownership labels but no matching cell id", "secret", s.Name)
				continue
			}
			if !seen[id] {
				seen[id] = true
				objs = append(objs, driver.Object{CellID: id})
			}
		}
		if list.Continue == "" {
			return objs, nil
		}
		opts.Continue = list.Continue
	}
}
