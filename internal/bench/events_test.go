package bench

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestFanoutRuns: the fan-out measurement runs end to end and every
// subscriber receives every claim's event: each decoding one gives a
// latency sample per claim, and a raw stream's missing frame would count
// as an error (its figures are the bench's; nothing here is timed).
func TestFanoutRuns(t *testing.T) {
	rep, err := benchFanout(t.Context(), t.TempDir(), 5, 20, 2)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Decoding != 1 || rep.Latency.N != 2*20 || rep.Latency.Errors != 0 ||
		len(rep.With) != 2 || len(rep.Without) != 3 || len(rep.RoundRatios) != 2 {
		t.Fatalf("fan-out report %+v", rep)
	}
	for _, s := range append(rep.With, rep.Without...) {
		if s.Errors != 0 || s.N != 20 {
			t.Fatalf("a series of 20 claims: %+v", s)
		}
	}
}

// TestRawStreamCounts: the raw subscriber counts exactly the cell.leased
// frames after its first cell.ready frame, however the reads cut the
// lines.
func TestRawStreamCounts(t *testing.T) {
	var body bytes.Buffer
	frame := func(id int, typ string) {
		fmt.Fprintf(&body, "id: %d\nevent: %s\ndata: {\"id\":\"%d\",\"type\":\"%s\"}\n\n", id, typ, id, typ)
	}
	frame(1, "cell.leased") // before the marker: not counted
	frame(2, "cell.ready")
	want := 0
	for i := 3; i < 503; i++ {
		typ := []string{"cell.leased", "cell.ready", "cell.destroyed"}[i%3]
		frame(i, typ)
		if typ == "cell.leased" {
			want++
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		b := body.Bytes()
		for i := 0; i < len(b); {
			n := min(1+i%13, len(b)-i) // pieces of 1 to 13 bytes
			w.Write(b[i : i+n])
			w.(http.Flusher).Flush()
			i += n
		}
	}))
	defer srv.Close()
	var following atomic.Int32
	if got := rawStream(t.Context(), srv.Client(), srv.URL, "t", 1<<20, &following); got != want || following.Load() != 1 {
		t.Fatalf("counted %d cell.leased frames (following %d), want %d (1)", got, following.Load(), want)
	}
}
