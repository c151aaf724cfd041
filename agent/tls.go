package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// The identities of the mutually authenticated channel (CONTRACT §13): a
// CA generated per cell issues the agent's server leaf and the control
// side's client leaf, each naming the cell and its role in a URI SAN.
// Both ends verify the peer's leaf against that one CA and by this URI,
// never by a host name or an IP address.

// AgentURI is the URI SAN of a cell agent's server leaf.
func AgentURI(cellID string) string { return "spiffe://sandboxwich/cell/" + cellID + "/agent" }

// ControlURI is the URI SAN of the client leaf of a cell's control side:
// the only client the cell's agent accepts.
func ControlURI(cellID string) string { return "spiffe://sandboxwich/cell/" + cellID + "/control" }

// ServerTLS is the agent's TLS configuration: TLS 1.3 only, a client
// certificate required and verified against ca (for client
// authentication), and accepted only when its leaf carries exactly one URI
// SAN, ControlURI(cellID).
func ServerTLS(cert tls.Certificate, ca *x509.CertPool, cellID string) *tls.Config {
	want := ControlURI(cellID)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("agent tls: no client certificate")
			}
			return checkURI(cs.PeerCertificates[0], want)
		},
	}
}

// ClientTLS is the control side's TLS configuration for one cell's agent:
// TLS 1.3 only, cert as its client certificate, and the server's chain
// verified against ca alone (for server authentication) and accepted only
// when its leaf carries exactly one URI SAN, AgentURI(cellID). The address
// dialled (a Pod IP) plays no part: the Go name check is replaced by this
// one.
func ClientTLS(cert tls.Certificate, ca *x509.CertPool, cellID string) *tls.Config {
	want := AgentURI(cellID)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// The chain and the URI are verified in VerifyConnection; the
		// standard verification would check the dialled address.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("agent tls: no server certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("agent tls: server certificate: %w", err)
			}
			return checkURI(leaf, want)
		},
	}
}

// checkURI requires leaf to carry exactly one URI SAN, want.
func checkURI(leaf *x509.Certificate, want string) error {
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		got := make([]string, len(leaf.URIs))
		for i, u := range leaf.URIs {
			got[i] = u.String()
		}
		return fmt.Errorf("agent tls: peer certificate names %q, want exactly %q", got, want)
	}
	return nil
}

// LoadServerTLS reads the agent's server leaf and key and the cell's CA
// certificate from PEM files (a Secret mounted read-only into the cell)
// and returns ServerTLS for them.
func LoadServerTLS(certFile, keyFile, caFile, cellID string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("agent tls: server certificate: %w", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("agent tls: client CA: %w", err)
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("agent tls: client CA %s holds no PEM certificate", caFile)
	}
	return ServerTLS(cert, ca, cellID), nil
}
