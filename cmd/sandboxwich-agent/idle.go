package main

import (
	"net/http"
	"sync"
	"time"
)

// idleRelease is how long the agent serves no request before it gives
// back the pages of its own executable (releaseFilePages).
const idleRelease = time.Second

// whenIdle calls release once the handler h has been without a request in
// flight for quiet, and again after every later busy spell: a warm cell's
// agent waits in its pool for seconds or minutes with none. A request
// that arrives meanwhile simply finds the pages gone and faults the ones
// it runs back in.
//
// release runs on one goroutine that lives as long as the process, woken
// by a channel timer: a goroutine that ended after each release (as
// time.AfterFunc's do) would look its start function up in the binary's
// function tables on the way out, faulting those pages back in at once.
func whenIdle(h http.Handler, quiet time.Duration, release func()) http.Handler {
	var mu sync.Mutex
	inFlight := 0
	timer := time.NewTimer(quiet)
	go func() {
		for range timer.C {
			release()
		}
	}()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		timer.Stop()
		mu.Unlock()
		defer func() {
			mu.Lock()
			if inFlight--; inFlight == 0 {
				timer.Reset(quiet)
			}
			mu.Unlock()
		}()
		h.ServeHTTP(w, r)
	})
}
