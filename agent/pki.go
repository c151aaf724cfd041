package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"
)

// CellPKI is the per-cell certificate authority of the mutually
// authenticated channel (CONTRACT §13) and the two leaves it issued, all
// PEM-encoded: ECDSA P-256 keys, the CA constrained to issue leaves only
// (path length zero), the server leaf for server authentication with URI
// SAN AgentURI, the client leaf for client authentication with URI SAN
// ControlURI. The CA key signs nothing after issuance; it is kept only so
// that the whole authority lives and dies with its cell.
type CellPKI struct {
	CACert, CAKey         []byte
	ServerCert, ServerKey []byte
	ClientCert, ClientKey []byte
}

// NewCellPKI generates a CA for cellID and issues its two leaves, valid
// from a minute before now (clock skew between the plane and a node) for
// validity.
func NewCellPKI(cellID string, now time.Time, validity time.Duration) (*CellPKI, error) {
	if cellID == "" || validity <= 0 {
		return nil, errors.New("agent pki: a cell ID and a positive validity are required")
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agent pki: %w", err)
	}
	notBefore, notAfter := now.Add(-time.Minute), now.Add(validity)
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "sandboxwich cell " + cellID + " CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, _, err := sign(caTmpl, caKey, nil, nil)
	if err != nil {
		return nil, err
	}
	out := &CellPKI{CACert: pemBlock("CERTIFICATE", caDER)}
	if out.CAKey, err = keyPEMOf(caKey); err != nil {
		return nil, err
	}
	if out.ServerCert, out.ServerKey, err = out.issue(AgentURI(cellID), x509.ExtKeyUsageServerAuth, notBefore, notAfter); err != nil {
		return nil, err
	}
	if out.ClientCert, out.ClientKey, err = out.issue(ControlURI(cellID), x509.ExtKeyUsageClientAuth, notBefore, notAfter); err != nil {
		return nil, err
	}
	return out, nil
}

// IssueServer issues a new server leaf for cellID from pki's CA key,
// replacing ServerCert and ServerKey: for a provider that adopts the CA an
// earlier, interrupted provisioning generated, before the agent's leaf
// was stored.
func (pki *CellPKI) IssueServer(cellID string, now time.Time, validity time.Duration) error {
	if cellID == "" || validity <= 0 {
		return errors.New("agent pki: a cell ID and a positive validity are required")
	}
	c, k, err := pki.issue(AgentURI(cellID), x509.ExtKeyUsageServerAuth, now.Add(-time.Minute), now.Add(validity))
	if err != nil {
		return err
	}
	pki.ServerCert, pki.ServerKey = c, k
	return nil
}

// issue signs a new leaf with URI SAN uri for usage with pki's CA.
func (pki *CellPKI) issue(uri string, usage x509.ExtKeyUsage, notBefore, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	caBlock, _ := pem.Decode(pki.CACert)
	keyBlock, _ := pem.Decode(pki.CAKey)
	if caBlock == nil || keyBlock == nil {
		return nil, nil, errors.New("agent pki: the CA certificate or key is not PEM")
	}
	caCert, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("agent pki: CA certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	caKey, ok := k.(*ecdsa.PrivateKey)
	if err != nil || !ok {
		return nil, nil, fmt.Errorf("agent pki: CA key is not an ECDSA PKCS #8 key (%v)", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("agent pki: %w", err)
	}
	u, err := url.Parse(uri)
	if err != nil {
		return nil, nil, fmt.Errorf("agent pki: %w", err)
	}
	der, _, err := sign(&x509.Certificate{
		Subject:               pkix.Name{CommonName: uri},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{usage},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{u},
	}, key, caCert, caKey)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEMOf(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), kp, nil
}

// sign issues tmpl for key's public half, signed by parent and parentKey
// (self-signed when parent is nil), with a random 128-bit serial.
func sign(tmpl *x509.Certificate, key *ecdsa.PrivateKey, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, fmt.Errorf("agent pki: %w", err)
	}
	tmpl.SerialNumber = serial
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("agent pki: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("agent pki: %w", err)
	}
	return der, cert, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func keyPEMOf(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("agent pki: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

// ClientConfig is ClientTLS for the control side's leaf of pki.
func (pki *CellPKI) ClientConfig(cellID string) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(pki.ClientCert, pki.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("agent pki: client leaf: %w", err)
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM(pki.CACert) {
		return nil, errors.New("agent pki: the CA certificate is not PEM")
	}
	return ClientTLS(cert, ca, cellID), nil
}

// ServerConfig is ServerTLS for the agent's leaf of pki.
func (pki *CellPKI) ServerConfig(cellID string) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(pki.ServerCert, pki.ServerKey)
	if err != nil {
		return nil, fmt.Errorf("agent pki: server leaf: %w", err)
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM(pki.CACert) {
		return nil, errors.New("agent pki: the CA certificate is not PEM")
	}
	return ServerTLS(cert, ca, cellID), nil
}
