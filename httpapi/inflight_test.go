package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestMaxRequestsPerPrincipal: with a cap of N requests in flight per
// token, the token's next request is 429 too_many_requests with
// Retry-After while N are held open; another token is unaffected; once
// one ends, the token is served again.
func TestMaxRequestsPerPrincipal(t *testing.T) {
	const limit = 2
	a := newAgentEnv(t, backends[0], 1, func(c *Config) { c.MaxRequestsPerPrincipal = limit })
	c := a.lease()
	// Each held request is a file write whose body never arrives.
	var held []net.Conn
	for range limit {
		conn, err := net.Dial("tcp", a.srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: 1000\r\n\r\n--B\r\n",
			leasePath(c.Lease.LeaseID, "/files/write"), tokAcme)
		held = append(held, conn)
	}
	inventory := func(token string) resp { return a.do("GET", "/v1/sterile-cells/inventory", token, nil) }
	// The held requests reach the handler in their own time.
	var r resp
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if r = inventory(tokAcme); r.status == http.StatusTooManyRequests {
			break
		}
	}
	r.errCode(t, 429, "too_many_requests")
	if ra := r.header.Get("Retry-After"); ra == "" {
		t.Error("a 429 without Retry-After")
	}
	inventory(tokGlobex).must(t, 200)
	held[0].Close()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if r = inventory(tokAcme); r.status != http.StatusTooManyRequests {
			break
		}
	}
	r.must(t, 200)
}

// TestOpenAPITooManyRequests: every route that takes a token documents
// the 429 of the in-flight cap.
func TestOpenAPITooManyRequests(t *testing.T) {
	d := loadDoc(t)
	for _, rt := range routes {
		if rt.access == accessProbe || rt.access == accessPublic {
			continue
		}
		if op := d.Paths.Find(rt.path).GetOperation(rt.method); op.Responses.Value("429") == nil {
			t.Errorf("%s does not document 429 too_many_requests", rt.pattern())
		}
	}
}
