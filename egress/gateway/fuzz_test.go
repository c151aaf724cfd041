package gateway

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandboxwich/sandboxwich/egress"
)

// FuzzAnswer: any packet gets no answer or a well-formed one to its one
// question, and an address only for a name the policy allows, and only
// the gateway's.
func FuzzAnswer(f *testing.F) {
	for _, name := range []string{"pkgs.test.", "evil.test.", "a.files.test."} {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 1})
		_ = b.StartQuestions()
		_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		q, _ := b.Finish()
		f.Add(q)
	}
	f.Add([]byte{0, 7, 1, 0, 0, 1})
	pol, err := egress.Parse([]string{"pkgs.test", "*.files.test:8443"})
	if err != nil {
		f.Fatal(err)
	}
	g, err := New(Config{Address: netip.MustParseAddr("192.0.2.53"), Lookup: func(netip.Addr) (Source, bool) { return Source{}, false }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		out, ok := g.answer(Source{Policy: pol}, msg)
		if !ok {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(out); err != nil {
			t.Fatalf("the answer does not parse: %v", err)
		}
		if !m.Response || len(m.Questions) != 1 {
			t.Fatalf("answer %+v", m)
		}
		for _, a := range m.Answers {
			ar, isA := a.Body.(*dnsmessage.AResource)
			if !isA || ar.A != [4]byte{192, 0, 2, 53} || !pol.AllowsName(m.Questions[0].Name.String()) {
				t.Fatalf("answered %v for %s", a, m.Questions[0].Name)
			}
		}
	})
}

// FuzzSniff: whatever a connection opens with, sniff returns within its
// bounds, and a host only with the bytes that named it, all of them.
func FuzzSniff(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: pkgs.test\r\n\r\n"))
	f.Add([]byte("SSH-2.0-x\r\n"))
	f.Add([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		go func() { _, _ = a.Write(in); a.Close() }()
		_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
		host, read, err := sniff(b)
		b.Close()
		if err == nil && len(read) > len(in) {
			t.Fatalf("read %d bytes of %d", len(read), len(in))
		}
		if err == nil && string(read) != string(in[:len(read)]) {
			t.Fatalf("the bytes to forward are not the ones read")
		}
		_ = host
	})
}
