package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestExecMaxOutputBytes: max_output_bytes raises the cap of each stream
// up to the ceiling (CONTRACT §25), JSON and streamed, and the answer
// states the cap that applied; without it the default 1 MiB holds; above
// the ceiling is 422, and above 1 MiB with an Idempotency-Key 400
// invalid_idempotency_key, before any record of the key is made.
func TestExecMaxOutputBytes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		path := leasePath(c.Lease.LeaseID, "/exec")
		const three = 3 << 20
		exec := func(kv ...any) (wire.ExecResponse, []byte) {
			r := a.do("POST", path, tokAcme, with(proofBody(c), kv...)).must(t, 200)
			checkSchema(t, "ExecResponse", r.body)
			res := decodeAs[wire.ExecResponse](t, r)
			out, err := base64.StdEncoding.DecodeString(res.StdoutBase64)
			if err != nil {
				t.Fatal(err)
			}
			return res, out
		}
		stream := func(kv ...any) (wire.ExecExit, int) {
			s := newSSE(t, a.stream(c, with(proofBody(c), kv...)))
			n := 0
			for {
				ev := s.event()
				switch ev.name {
				case wire.EventStdout:
					var o wire.ExecOutput
					if err := json.Unmarshal([]byte(ev.data), &o); err != nil {
						t.Fatal(err)
					}
					b, _ := base64.StdEncoding.DecodeString(o.DataBase64)
					n += len(b)
				case wire.EventExit:
					checkSchema(t, "ExecExit", []byte(ev.data))
					var e wire.ExecExit
					if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
						t.Fatal(err)
					}
					s.end()
					return e, n
				default:
					t.Fatalf("event %s %s", ev.name, ev.data)
				}
			}
		}

		res, out := exec("argv", []string{"emit", "3145728"}, "max_output_bytes", 4<<20)
		if len(out) != three || res.Truncated || res.MaxOutputBytes != 4<<20 || strings.Trim(string(out), "x") != "" {
			t.Fatalf("3 MiB with max_output_bytes 4 MiB: %d bytes, truncated %v, cap %d", len(out), res.Truncated, res.MaxOutputBytes)
		}
		if e, n := stream("argv", []string{"emit", "3145728"}, "max_output_bytes", 4<<20); n != three || e.Truncated || e.MaxOutputBytes != 4<<20 {
			t.Fatalf("3 MiB streamed with max_output_bytes 4 MiB: %d bytes, %+v", n, e)
		}
		res, out = exec("argv", []string{"emit", "3145728"})
		if len(out) != 1<<20 || !res.Truncated || res.MaxOutputBytes != 1<<20 {
			t.Fatalf("3 MiB with the default cap: %d bytes, truncated %v, cap %d", len(out), res.Truncated, res.MaxOutputBytes)
		}
		if e, n := stream("argv", []string{"emit", "3145728"}); n != 1<<20 || !e.Truncated || e.MaxOutputBytes != 1<<20 {
			t.Fatalf("3 MiB streamed with the default cap: %d bytes, %+v", n, e)
		}

		before := a.ops()["exec"]
		for _, v := range []any{16<<20 + 1, 0, -1, "big", 1.5, uint64(1) << 63} {
			a.do("POST", path, tokAcme, with(proofBody(c), "argv", []string{"echo"}, "max_output_bytes", v)).errCode(t, 422, "invalid_request")
		}
		r := a.do("POST", path, tokAcme, with(proofBody(c), "argv", []string{"echo"}, "max_output_bytes", 16<<20+1))
		if !bytes.Contains(r.body, []byte("16777216")) {
			t.Fatalf("the refusal does not state the ceiling: %s", r.body)
		}
		big := with(proofBody(c), "argv", []string{"echo", "x"}, "max_output_bytes", 2<<20)
		a.do("POST", path, tokAcme, big, idemHeader, "big-output").errCode(t, 400, "invalid_idempotency_key")
		a.do("POST", path, tokAcme, with(big, "max_output_bytes", "1e300"), idemHeader, "not-a-number").errCode(t, 422, "invalid_request")
		a.do("POST", path, tokAcme, with(big, "max_output_bytes", uint64(1)<<63), idemHeader, "big-output").errCode(t, 400, "invalid_idempotency_key")
		if n := a.ops()["exec"]; n != before {
			t.Fatalf("%d refused execs reached the agent", n-before)
		}
		// No record was made: the same key now serves the request within 1 MiB.
		ok := with(big, "max_output_bytes", 1<<20)
		r1 := a.do("POST", path, tokAcme, ok, idemHeader, "big-output").must(t, 200)
		r2 := a.do("POST", path, tokAcme, ok, idemHeader, "big-output").must(t, 200)
		if !bytes.Equal(r1.body, r2.body) || a.ops()["exec"] != before+1 {
			t.Fatalf("the key after the refusal: %s vs %s", r1.body, r2.body)
		}
		// Streamed with a key: refused as before.
		res2 := a.stream(c, big, idemHeader, "big-stream")
		if res2.StatusCode != 400 {
			t.Fatalf("streamed exec with a key: %d", res2.StatusCode)
		}
	})
}

// TestExecArgLimitsHTTP: an argument or env value of 200 KiB, which the
// cell's kernel would refuse, is 422 invalid_request through the API
// (JSON and streamed), nothing reaches the cell, and the lease stays
// usable.
func TestExecArgLimitsHTTP(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		a := newAgentEnv(t, b, 1)
		c := a.lease()
		path := leasePath(c.Lease.LeaseID, "/exec")
		big := strings.Repeat("x", 200<<10)
		for name, body := range map[string]map[string]any{
			"argument":  with(proofBody(c), "argv", []string{"echo", big}),
			"env value": with(proofBody(c), "argv", []string{"echo"}, "env", map[string]string{"BIG": big}),
		} {
			r := a.do("POST", path, tokAcme, body)
			r.errCode(t, 422, "invalid_request")
			if bytes.Contains(r.body, []byte("xxxx")) {
				t.Fatalf("%s: the refusal repeats the input", name)
			}
			if res := a.stream(c, body); res.StatusCode != 422 {
				t.Fatalf("%s, streamed: %d", name, res.StatusCode)
			}
			a.do("POST", leasePath(c.Lease.LeaseID, "/launch"), tokAcme, body).errCode(t, 422, "invalid_request")
		}
		if n := a.ops()["exec"] + a.ops()["launch"]; n != 0 {
			t.Fatalf("%d refused requests reached the agent", n)
		}
		r := a.do("POST", path, tokAcme, with(proofBody(c), "argv", []string{"echo", "still", "here"})).must(t, 200)
		if res := decodeAs[wire.ExecResponse](t, r); res.StdoutBase64 != base64.StdEncoding.EncodeToString([]byte("still here\n")) {
			t.Fatalf("echo after the refusals: %+v", res)
		}
		if st := a.state(c); st != lease.Leased {
			t.Fatalf("the lease after the refusals: %s", st)
		}
	})
}

// TestExecDuringLeaseEnd: a release or revocation during an exec (JSON
// and streamed) answers the exec with reason killed, exit code 137 and
// signal KILL, as expiry does; the cell ends destroyed, as asked, and no
// cell_lost is logged.
func TestExecDuringLeaseEnd(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		for _, how := range []string{"release", "revoke"} {
			for _, streamed := range []bool{false, true} {
				name := how + "/json"
				if streamed {
					name = how + "/stream"
				}
				t.Run(name, func(t *testing.T) {
					a := newAgentEnv(t, b, 1)
					c := a.lease()
					body, err := json.Marshal(with(proofBody(c), "argv", []string{"sleep", "60"}))
					if err != nil {
						t.Fatal(err)
					}
					req, err := http.NewRequest("POST", a.srv.URL+leasePath(c.Lease.LeaseID, "/exec"), bytes.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					req.Header.Set("Authorization", "Bearer "+tokAcme)
					req.Header.Set("Content-Type", "application/json")
					if streamed {
						req.Header.Set("Accept", "text/event-stream")
					}
					type answer struct {
						status int
						body   []byte
						err    error
					}
					done := make(chan answer, 1)
					go func() {
						res, err := a.srv.Client().Do(req)
						if err != nil {
							done <- answer{err: err}
							return
						}
						defer res.Body.Close()
						b, err := io.ReadAll(res.Body)
						done <- answer{res.StatusCode, b, err}
					}()
					for a.ops()["exec"] == 0 {
						time.Sleep(time.Millisecond)
					}
					if how == "release" {
						a.do("POST", leasePath(c.Lease.LeaseID, "/release"), tokAcme, with(proofBody(c), "disposition", "destroyed")).must(t, 202)
					} else {
						a.do("POST", leasePath(c.Lease.LeaseID, "/revoke"), tokAcme, map[string]any{"disposition": "destroyed"}).must(t, 202)
					}
					a.plane.Pools().Pass(t.Context()) // destroys the cell under the command
					ans := <-done
					if ans.err != nil || ans.status != 200 {
						t.Fatalf("exec during a %s: %d %s %v", how, ans.status, ans.body, ans.err)
					}
					var exit wire.ExecExit
					data := ans.body
					if streamed {
						_, after, ok := bytes.Cut(ans.body, []byte("event: exit\ndata: "))
						if !ok {
							t.Fatalf("exec stream during a %s: %s", how, ans.body)
						}
						data, _, _ = bytes.Cut(after, []byte("\n"))
						checkSchema(t, "ExecExit", data)
					} else {
						checkSchema(t, "ExecResponse", data)
					}
					if err := json.Unmarshal(data, &exit); err != nil {
						t.Fatal(err)
					}
					if exit.Reason != wire.ReasonKilled || exit.ExitCode != 137 || exit.Signal == nil || *exit.Signal != "KILL" || exit.TimedOut {
						t.Fatalf("exec during a %s: %s, want reason killed", how, data)
					}
					a.plane.Pools().Pass(t.Context())
					if st := a.state(c); st != lease.Destroyed {
						t.Fatalf("the cell after the %s: %s, want destroyed", how, st)
					}
					if logs := a.logs.String(); strings.Contains(logs, "cell lost") || strings.Contains(logs, "cell_lost") {
						t.Fatalf("a %s logged a lost cell:\n%s", how, logs)
					}
				})
			}
		}
	})
}
