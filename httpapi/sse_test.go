package httpapi

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// countingWriter is an http.ResponseWriter (and Flusher) that keeps what is
// written and counts the writes.
type countingWriter struct {
	hd     http.Header
	body   bytes.Buffer
	writes int
}

func (w *countingWriter) Header() http.Header { return w.hd }
func (w *countingWriter) WriteHeader(int)     {}
func (w *countingWriter) Flush()              {}
func (w *countingWriter) Write(b []byte) (int, error) {
	w.writes++
	return w.body.Write(b)
}

// TestStreamJoinsFrames: a batch of frames reaches the response in order
// and whole, in writes of about writeChunk — not one write per frame,
// which is a chunk and a system call each.
func TestStreamJoinsFrames(t *testing.T) {
	w := &countingWriter{hd: http.Header{}}
	s := newEventStream(w, time.Hour)
	var frames [][]byte
	var want bytes.Buffer
	for i := range 3000 {
		f := fmt.Appendf(nil, "id: %d\nevent: cell.leased\ndata: {\"id\":\"%d\",\"pad\":\"%0200d\"}\n\n", i, i, i)
		frames = append(frames, f)
		want.Write(f)
	}
	if err := s.sendFrames(frames); err != nil {
		t.Fatal(err)
	}
	s.stop()
	if !bytes.Equal(w.body.Bytes(), want.Bytes()) {
		t.Fatalf("the stream's bytes differ from its frames in order (%d bytes, want %d)", w.body.Len(), want.Len())
	}
	if max := want.Len()/(writeChunk/2) + 1; w.writes > max {
		t.Fatalf("%d frames (%d bytes) took %d writes, want at most %d", len(frames), want.Len(), w.writes, max)
	}
}
