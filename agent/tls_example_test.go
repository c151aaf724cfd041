package agent_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/agent/cellagent"
)

// A cell's channel over mutual TLS: the provider issues the cell's CA and
// leaves, the agent serves with its leaf (agent.ServerTLS, as
// sandboxwich-agent -tls-cert … does) and the control side dials with the
// cell's client leaf (agent.ClientTLS), each verifying the other by its
// URI SAN.
func ExampleNewCellPKI() {
	const cell = "0190c3c2-5b6e-7c1d-9a2b-3c4d5e6f7a8b"
	pki, err := agent.NewCellPKI(cell, time.Now(), time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	home, _ := os.MkdirTemp("", "sbw-example-")
	defer os.RemoveAll(home)
	a, err := cellagent.New(cellagent.Config{CellID: cell, Digest: "sha256:" + fmt.Sprintf("%064d", 0), Home: home})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Shutdown()
	serverCfg, _ := pki.ServerConfig(cell)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: agent.NewHandler(a), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, serverCfg))
	defer srv.Close()

	clientCfg, _ := pki.ClientConfig(cell)
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: clientCfg}
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
	st, err := c.Status(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.State, st.CellID == cell)
	fmt.Println(agent.ControlURI(cell))
	// Output:
	// waiting true
	// spiffe://sandboxwich/cell/0190c3c2-5b6e-7c1d-9a2b-3c4d5e6f7a8b/control
}
