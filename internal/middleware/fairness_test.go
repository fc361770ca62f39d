// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

// Tests that no single client can hold or inflate what the others need:
// the budget, the learnt sizes, the queue's places (issue 28).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/otelthrottle/throttle/internal/decision"
)

// distinctRemotes returns n remote addresses of distinct peer slots.
func distinctRemotes(ps *Peers, n int) []string {
	var out []string
	seen := map[peer]bool{}
	for i := 1; len(out) < n; i++ {
		a := fmt.Sprintf("10.9.%d.%d:1", i/250, i%250)
		if p := ps.ofRemote(a); !seen[p] {
			seen[p] = true
			out = append(out, a)
		}
	}
	return out
}

// TestPeersFairShare: while n peers are active each is admitted up to
// max(1/n, 1/8) of the budget, never more than peer_share, and its bodies
// grow beyond that (to peer_share) only while nobody is refused for the
// budget: two peers can no longer take the whole budget from a third
// (issue 28 point 5). A peer stays active for peerActiveFor after its last
// request, and while it holds bytes.
func TestPeersFairShare(t *testing.T) {
	ps := NewPeers(0.5)
	b := NewBudgetWith(BudgetConfig{Max: 1200, Peers: ps})
	r := distinctRemotes(ps, 12)
	p := func(i int) peer { return ps.ofRemote(r[i]) }
	at := peerRecountEvery
	touch := func(i int) {
		at += peerRecountEvery
		ps.touch(p(i), at)
	}

	touch(0)
	assert.Equal(t, 1, ps.Active())
	assert.EqualValues(t, 600, b.maxFor(p(0)), "alone: peer_share")
	for i := range 3 {
		touch(i)
	}
	assert.Equal(t, 3, ps.Active())
	assert.EqualValues(t, 400, b.maxFor(p(0)), "three peers: a third each")
	require.True(t, b.admit(400, p(0)))
	require.True(t, b.admit(400, p(1)))
	assert.False(t, b.admit(1, p(0)), "at its share")
	assert.True(t, b.admit(400, p(2)), "the third peer still has its share")
	assert.EqualValues(t, 600, b.peers.growLimit(1200, at), "uncontended, a body grows to peer_share")
	b.peers.refused(at)
	assert.EqualValues(t, 400, b.peers.growLimit(1200, at), "while a peer is refused for the budget, to its fair share")
	assert.EqualValues(t, 600, b.peers.growLimit(1200, at+contendedFor), "and no longer once that is past")
	for i := range 12 {
		touch(i)
	}
	assert.EqualValues(t, 150, b.maxFor(p(0)), "many peers: at least an eighth each")

	// Peers that stop sending stop counting, unless they hold bytes.
	at += peerActiveFor + peerRecountEvery
	ps.touch(p(3), at)
	assert.Equal(t, 4, ps.Active(), "the three holding bytes and the one that sent")
	b.release(400, p(0))
	b.release(400, p(1))
	b.release(400, p(2))
	at += peerRecountEvery
	ps.touch(p(3), at)
	assert.Equal(t, 1, ps.Active())

	unlimited := NewPeers(1)
	unlimited.touch(unlimited.ofRemote(r[0]), time.Hour)
	assert.EqualValues(t, 1000, unlimited.limit(1000), "peer_share 1: no per-peer limit")
}

// TestHTTPLargeContentLengthNoLockout: a peer that announces a body larger
// than the budget and sends it slowly holds at most its share; other peers
// are admitted meanwhile (issue 28 point 1: a body whose Content-Length is
// at least the budget used to ask for all of it, which stopped every
// admission while it waited).
func TestHTTPLargeContentLengthNoLockout(t *testing.T) {
	const maxBytes = 256 << 10
	b := NewBudgetWith(BudgetConfig{Max: maxBytes, PeerShare: 0.5, Wait: admissionWait})
	f := newHTTPFixture(t, b, 32<<10, nil)
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	// Two slow bodies from the loopback peer, each announcing twice the
	// budget; the second waits for its peer's share.
	for range 2 {
		slowClient(t, srv.Listener.Addr().String(), 2*maxBytes, maxBytes/4, time.Second)
	}
	slow := b.Peers().slot(b.peerOfRemote("127.0.0.1:1"))
	require.Eventually(t, func() bool { return slow.reserved.Load() >= maxBytes/4 }, admissionWait, time.Millisecond,
		"the slow peer holds most of its share")

	other := distinctRemotes(b.Peers(), 2)[1]
	for range 4 {
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(make([]byte, 16<<10)))
		req.RemoteAddr = other
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, req)
		assert.Equal(t, http.StatusOK, rec.Code, "another peer is never locked out")
	}
	assert.LessOrEqual(t, slow.reserved.Load(), int64(maxBytes/2), "never more than its share")
}

// TestHTTPLearnsPerPeerFromAccepted: what a body reserves first is learnt
// per peer, and only from bodies the handler accepted: a large body that
// fails to decode (or is refused by an authenticator) teaches nothing, and
// one peer's large bodies do not raise what another's reserve (issue 28
// point 2).
func TestHTTPLearnsPerPeerFromAccepted(t *testing.T) {
	f := newHTTPFixture(t, NewBudget(8<<20), 16<<10, nil)
	var reserved int64
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reserved = f.budget.Reserved()
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Refuse") != "" {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	r := distinctRemotes(f.budget.Peers(), 2)
	send := func(remote string, size int, refuse bool) int64 {
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", io.NopCloser(bytes.NewReader(make([]byte, size))))
		req.ContentLength = -1 // as a compressed body: its length unknown
		req.RemoteAddr = remote
		if refuse {
			req.Header.Set("X-Refuse", "1")
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
		return reserved
	}
	assert.EqualValues(t, 16<<10, send(r[0], 1<<20, true), "unknown_size first")
	assert.EqualValues(t, 16<<10, send(r[0], 1<<10, false), "the refused 1 MiB body taught nothing")
	assert.EqualValues(t, 1<<10, send(r[0], 2<<20, false), "learnt from the accepted one")
	assert.EqualValues(t, 2<<20, send(r[0], 1, false), "its peer's largest accepted body")
	assert.EqualValues(t, 16<<10, send(r[1], 1, false), "another peer: unknown_size, not the first one's 2 MiB")
}

// TestGRPCEstimateNotFromRefusedCalls: a call whose message arrived but
// that an interceptor refused (an authenticator; here one that refuses
// everything) teaches nothing: grpc-go reports the message's size before
// any interceptor runs (issue 28 point 2).
func TestGRPCEstimateNotFromRefusedCalls(t *testing.T) {
	deny := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, status.Error(codes.Unauthenticated, "no")
	}
	f := newGRPCFixtureWith(t, NewBudget(1<<30), 0, []grpc.ServerOption{grpc.ChainUnaryInterceptor(deny)})
	for range 3 {
		assert.Equal(t, codes.Unauthenticated, status.Code(f.export(context.Background())))
	}
	f.requireReleased(t)
	assert.EqualValues(t, DefaultUnknownSize, f.mw.sizeEstimate(decision.SignalTraces, loopback(f.mw)))
}

// TestHoldPerPeerPlaces: one peer holds at most its share of the queue's
// places, so a peer flooding the queue leaves room for the others (issue
// 28 point 4).
func TestHoldPerPeerPlaces(t *testing.T) {
	ps := NewPeers(0.5)
	dec := &fakeDecider{}
	dec.setAll(decision.VerdictDenyShed)
	q := NewHold(dec, ps, admissionWait, 4, testTick)
	t.Cleanup(q.Close)
	r := distinctRemotes(ps, 2)
	a, b := ps.ofRemote(r[0]), ps.ofRemote(r[1])
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { q.Wait(ctx, decision.SignalTraces, decision.VerdictDenyShed, a) })
	}
	heldEventually(t, q, 2)
	assert.Equal(t, decision.VerdictDenyShed, q.Wait(context.Background(), decision.SignalTraces, decision.VerdictDenyShed, a),
		"peer a holds its share of the places: refused at once")
	wg.Go(func() { q.Wait(ctx, decision.SignalTraces, decision.VerdictDenyShed, b) })
	heldEventually(t, q, 3)
	cancel()
	wg.Wait()
	assert.Zero(t, q.Held())
}

// TestHTTPUnclassifiedReported: a request no route matches is let through
// untouched, but reported, so that a receiver serving a custom path
// without a matching route does not leave the throttle a silent no-op
// (issue 28 point 10).
func TestHTTPUnclassifiedReported(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	f := newHTTPFixture(t, NewBudget(1<<20), 0, nil, func(c *Config) {
		c.Unclassified = func(p Protocol, path string) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, p.String()+" "+path)
		}
	})
	f.dec.setAll(decision.VerdictDenyOpen)
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/custom/traces", bytes.NewReader([]byte("x"))))
	assert.Equal(t, http.StatusOK, rec.Code)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"http /custom/traces"}, seen)
}

// TestInflightCounts: the admitted, unfinished requests are counted over
// HTTP and gRPC (the demand signal sets the held ones against them); held
// or refused ones are not.
func TestInflightCounts(t *testing.T) {
	in := &Inflight{}
	f := newHTTPFixture(t, NewBudget(1<<20), 0, nil, func(c *Config) { c.Inflight = in })
	entered, hold := make(chan struct{}), make(chan struct{})
	h := f.mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		entered <- struct{}{}
		<-hold
	}))
	go h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader([]byte("x"))))
	<-entered
	assert.EqualValues(t, 1, in.Load())
	f.dec.set(decision.SignalLogs, decision.VerdictDenyOpen)
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/logs", bytes.NewReader([]byte("x"))))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.EqualValues(t, 1, in.Load(), "a refusal is not in flight")
	close(hold)
	require.Eventually(t, func() bool { return in.Load() == 0 }, admissionWait, time.Millisecond)

	g := newGRPCFixture(t, NewBudget(1<<20), 0, func(c *Config) { c.Inflight = in })
	g.push.hold = make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- g.pushAll(context.Background(), 1, 10) }()
	require.Eventually(t, func() bool { return g.push.messages.Load() == 1 }, admissionWait, time.Millisecond)
	assert.EqualValues(t, 1, in.Load())
	close(g.push.hold)
	require.NoError(t, <-errc)
	g.requireReleased(t)
	assert.Zero(t, in.Load())
}
