// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

// The hold at the HTTP level: a request the decision refuses waits, its
// body unread, and is decided again until it is admitted or has waited
// max_wait.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// heldServe serves req with f on its own goroutine; the answer's status
// comes on the channel.
func heldServe(f *httpFixture, req *http.Request) <-chan int {
	out := make(chan int, 1)
	go func() { out <- serve(f.h, req).Code }()
	return out
}

func (f *httpFixture) heldEventually(t *testing.T, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return f.stats().HeldRequests == n }, admissionWait, time.Millisecond,
		"held %d, want %d", f.stats().HeldRequests, n)
}

// TestHTTPHoldAdmits: a request refused by the decision is held, unread
// and not in flight, and admitted once a later decision admits it; it is
// counted once, as admitted.
func TestHTTPHoldAdmits(t *testing.T) {
	f := newHTTPFixture(t, 1<<20, withHold(admissionWait, 10))
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	body, _ := pacedRequest(context.Background(), 10)
	got := heldServe(f, body)
	f.heldEventually(t, 1)
	select {
	case code := <-got:
		t.Fatalf("answered %d while the decision still refuses", code)
	case <-time.After(250 * time.Millisecond): // two re-decisions
	}
	assert.Zero(t, f.next.calls.Load())
	assert.Zero(t, f.stats().Inflight)
	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	assert.Equal(t, http.StatusOK, <-got)
	assert.EqualValues(t, 10, f.next.read.Load())
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictAdmit))
	assert.EqualValues(t, 1, f.rec.total())
	f.heldEventually(t, 0)
}

// TestHTTPHoldMaxWait: a request no decision admits within max_wait is
// refused with the denial of a last decision (Open now, though it was
// first refused for shedding), its body unread.
func TestHTTPHoldMaxWait(t *testing.T) {
	f := newHTTPFixture(t, 1<<20, withHold(50*time.Millisecond, 10))
	f.dec.set(decision.SignalLogs, decision.VerdictDenyShed)
	got := heldServe(f, httptest.NewRequest(http.MethodPost, "/v1/logs", &failingBody{t: t}))
	f.heldEventually(t, 1)
	f.dec.set(decision.SignalLogs, decision.VerdictDenyOpen)
	assert.Equal(t, http.StatusTooManyRequests, <-got)
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalLogs, decision.VerdictDenyOpen))
	assert.EqualValues(t, 1, f.rec.total())
	assert.Zero(t, f.stats().HeldRequests)
}

// TestHTTPHoldFull: beyond max_requests a request is refused at once; a
// held client that goes away stops waiting at once.
func TestHTTPHoldFull(t *testing.T) {
	f := newHTTPFixture(t, 1<<20, withHold(admissionWait, 2))
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	ctx, cancel := context.WithCancel(context.Background())
	a := heldServe(f, post("/v1/traces", "10.0.0.1:1", 10).WithContext(ctx))
	b := heldServe(f, post("/v1/traces", "10.0.0.2:1", 10).WithContext(ctx))
	f.heldEventually(t, 2)
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, httptest.NewRequest(http.MethodPost, "/v1/traces", &failingBody{t: t})).Code)
	cancel()
	assert.Equal(t, http.StatusTooManyRequests, <-a)
	assert.Equal(t, http.StatusTooManyRequests, <-b)
	f.heldEventually(t, 0)
	assert.EqualValues(t, 3, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyShed))
}
