package agent_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/agent/cellagent"
)

// leaf issues a certificate with the given URI SANs and extended key usage
// from pki's CA: the leaves a test needs beyond the two NewCellPKI issues.
func leaf(t *testing.T, pki *agent.CellPKI, usage x509.ExtKeyUsage, uris ...string) tls.Certificate {
	t.Helper()
	caBlock, _ := pem.Decode(pki.CACert)
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	keyBlock, _ := pem.Decode(pki.CAKey)
	k, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	for _, s := range uris {
		u, _ := url.Parse(s)
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func newPKI(t *testing.T, cellID string) *agent.CellPKI {
	t.Helper()
	pki, err := agent.NewCellPKI(cellID, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pki
}

func pool(t *testing.T, pki *agent.CellPKI) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pki.CACert) {
		t.Fatal("CA not PEM")
	}
	return p
}

// serveTLS serves an agent for cellID on loopback with cfg and returns its
// address.
func serveTLS(t *testing.T, cellID string, cfg *tls.Config) string {
	t.Helper()
	a, err := cellagent.New(cellagent.Config{CellID: cellID, Digest: "sha256:" + strings.Repeat("a", 64), Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Shutdown)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: agent.NewHandler(a), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, cfg))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func status(addr string, cfg *tls.Config) (agent.Status, error) {
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: cfg}
		return d.DialContext(ctx, "tcp", addr)
	})
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Status(ctx)
}

// TestMutualTLS: the agent answers only the control leaf of its own cell
// from its own CA, over TLS 1.3; the control side accepts only the agent
// leaf of that cell from that CA, whatever address it dialled.
func TestMutualTLS(t *testing.T) {
	const cell, other = "0b7e6c2a-2f4e-4a57-9f0e-1d6c3b9a8e10", "5d1f0c3e-7a2b-4c6d-8e9f-0a1b2c3d4e5f"
	pki := newPKI(t, cell)
	serverCfg, err := pki.ServerConfig(cell)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, cell, serverCfg)
	good, err := pki.ClientConfig(cell)
	if err != nil {
		t.Fatal(err)
	}
	st, err := status(addr, good)
	if err != nil {
		t.Fatalf("the cell's own control leaf: %v", err)
	}
	if st.CellID != cell || st.State != agent.Waiting {
		t.Fatalf("status %+v", st)
	}

	ca := pool(t, pki)
	foreign := newPKI(t, cell) // another CA, the right URI
	foreignCert, err := tls.X509KeyPair(foreign.ClientCert, foreign.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	tls12 := good.Clone()
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	for name, cfg := range map[string]*tls.Config{
		"another cell's control leaf":  agent.ClientTLS(leaf(t, pki, x509.ExtKeyUsageClientAuth, agent.ControlURI(other)), ca, cell),
		"the agent's URI as client":    agent.ClientTLS(leaf(t, pki, x509.ExtKeyUsageClientAuth, agent.AgentURI(cell)), ca, cell),
		"a second URI SAN":             agent.ClientTLS(leaf(t, pki, x509.ExtKeyUsageClientAuth, agent.ControlURI(cell), "spiffe://sandboxwich/x"), ca, cell),
		"a server-auth leaf as client": agent.ClientTLS(leaf(t, pki, x509.ExtKeyUsageServerAuth, agent.ControlURI(cell)), ca, cell),
		"no client certificate":        agent.ClientTLS(tls.Certificate{}, ca, cell),
		"another CA's control leaf":    agent.ClientTLS(foreignCert, ca, cell),
		"TLS 1.2":                      tls12,
	} {
		if name == "no client certificate" {
			cfg.Certificates = nil
		}
		if st, err := status(addr, cfg); err == nil {
			t.Errorf("%s: the agent answered %+v", name, st)
		} else {
			t.Logf("%s: refused: %v", name, err)
		}
	}

	// The control side's checks of the server.
	for name, srv := range map[string]tls.Certificate{
		"another cell's agent leaf": leaf(t, pki, x509.ExtKeyUsageServerAuth, agent.AgentURI(other)),
		"the control URI as server": leaf(t, pki, x509.ExtKeyUsageServerAuth, agent.ControlURI(cell)),
		"a client-auth leaf":        leaf(t, pki, x509.ExtKeyUsageClientAuth, agent.AgentURI(cell)),
		"another CA's agent leaf": func() tls.Certificate {
			c, err := tls.X509KeyPair(foreign.ServerCert, foreign.ServerKey)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}(),
	} {
		addr := serveTLS(t, cell, agent.ServerTLS(srv, ca, cell))
		_, err := status(addr, good)
		if err == nil || !strings.Contains(err.Error(), "agent tls") {
			t.Errorf("%s: the control side accepted it (%v)", name, err)
		}
	}
}

// TestNewCellPKI: the leaves carry their URIs and usages and chain to the
// cell's CA, which may issue leaves only.
func TestNewCellPKI(t *testing.T) {
	const cell = "c1"
	pki := newPKI(t, cell)
	ca := pool(t, pki)
	for _, c := range []struct {
		cert  []byte
		uri   string
		usage x509.ExtKeyUsage
	}{{pki.ServerCert, agent.AgentURI(cell), x509.ExtKeyUsageServerAuth}, {pki.ClientCert, agent.ControlURI(cell), x509.ExtKeyUsageClientAuth}} {
		b, _ := pem.Decode(c.cert)
		leaf, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != c.uri || leaf.IsCA {
			t.Errorf("leaf URIs %v IsCA %v, want %s", leaf.URIs, leaf.IsCA, c.uri)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s: %v", c.uri, err)
		}
	}
	b, _ := pem.Decode(pki.CACert)
	caCert, _ := x509.ParseCertificate(b.Bytes)
	if !caCert.IsCA || caCert.MaxPathLen != 0 || !caCert.MaxPathLenZero {
		t.Errorf("CA IsCA %v MaxPathLen %d", caCert.IsCA, caCert.MaxPathLen)
	}
	// A server leaf issued again from the CA key: another key, the same
	// identity and CA.
	old := pki.ServerCert
	if err := pki.IssueServer(cell, time.Now(), time.Hour); err != nil {
		t.Fatal(err)
	}
	b, _ = pem.Decode(pki.ServerCert)
	again, err := x509.ParseCertificate(b.Bytes)
	if err != nil || string(old) == string(pki.ServerCert) {
		t.Fatalf("IssueServer: %v", err)
	}
	if _, err := again.Verify(x509.VerifyOptions{Roots: ca, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil || again.URIs[0].String() != agent.AgentURI(cell) {
		t.Fatalf("reissued leaf: %v %v", again.URIs, err)
	}
	if _, err := agent.NewCellPKI("", time.Now(), time.Hour); err == nil {
		t.Error("an empty cell ID was accepted")
	}
}

// BenchmarkChannel compares a status round trip over the per-cell mTLS
// channel (connections kept alive, as the drivers' clients do) with the
// same over plain TCP, in the same run: report the ratio, not the times.
func BenchmarkChannel(b *testing.B) {
	const cell = "bench-cell"
	pki, err := agent.NewCellPKI(cell, time.Now(), time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	a, err := cellagent.New(cellagent.Config{CellID: cell, Digest: "sha256:" + strings.Repeat("a", 64), Home: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Shutdown()
	serve := func(cfg *tls.Config) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &http.Server{Handler: agent.NewHandler(a), ErrorLog: log.New(io.Discard, "", 0)}
		if cfg != nil {
			go srv.Serve(tls.NewListener(ln, cfg))
		} else {
			go srv.Serve(ln)
		}
		b.Cleanup(func() { srv.Close() })
		return ln.Addr().String()
	}
	serverCfg, _ := pki.ServerConfig(cell)
	clientCfg, _ := pki.ClientConfig(cell)
	for _, bc := range []struct {
		name string
		srv  *tls.Config
		dial func(ctx context.Context, addr string) (net.Conn, error)
	}{
		{"plain", nil, func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}},
		{"mtls", serverCfg, func(ctx context.Context, addr string) (net.Conn, error) {
			d := tls.Dialer{Config: clientCfg}
			return d.DialContext(ctx, "tcp", addr)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			addr := serve(bc.srv)
			c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return bc.dial(ctx, addr) })
			defer c.CloseIdleConnections()
			ctx := context.Background()
			for b.Loop() {
				if _, err := c.Status(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
