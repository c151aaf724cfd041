package hostile

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// TestHostileUploadHeldWithoutProof: a file write keeps the server's read
// timeout until the plane has checked its proof and found its lease (issue
// 40: 3,000 connections to random lease IDs stayed open past 70 s). A
// connection that sends the headers and never the proof, one that stops
// inside the proof, and one whose proof names no lease and whose content
// never ends are each closed by the server.
func TestHostileUploadHeldWithoutProof(t *testing.T) {
	t.Parallel()
	addr, _, token, _ := slowServer(t)
	proof := mustJSON(t, map[string]any{
		"lease_attestation": "swla1_" + strings.Repeat("a", 64), "generation": 1, "organization_id": "org-1",
		"workspace_id": "workspace-1", "thread_id": "thread-1", "runner_session_id": "session-1", "path": "/f",
	})
	proofPart := "--B\r\nContent-Disposition: form-data; name=\"proof\"\r\nContent-Type: application/json\r\n\r\n"
	for _, tc := range []struct{ name, body string }{
		{"no body at all", ""},
		{"inside the proof", proofPart + proof[:len(proof)/2]},
		{"an unknown lease, content never ending", proofPart + proof + "\r\n--B\r\nContent-Disposition: form-data; name=\"content\"\r\n\r\nxx"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/sterile-cell-leases/%s/files/write HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
				"Content-Type: multipart/form-data; boundary=B\r\nContent-Length: %d\r\n\r\n%s", uuid.NewString(), token, 10<<20, tc.body)
			_, got := closedWithin(t, conn, 20*slowRead)
			if strings.Contains(got, `"ok":true`) {
				t.Fatalf("a write without a valid proof was answered %q", got)
			}
		})
	}
}
