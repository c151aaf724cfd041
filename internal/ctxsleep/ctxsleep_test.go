package ctxsleep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/internal/ctxsleep"
)

func TestSleep(t *testing.T) {
	if err := ctxsleep.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("a full sleep: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := ctxsleep.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) > time.Minute {
		t.Fatalf("a sleep under an ended context: %v after %v", err, time.Since(start))
	}
}
