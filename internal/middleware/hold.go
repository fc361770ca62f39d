// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// DefaultHoldTick is how often held requests are decided again.
const DefaultHoldTick = 100 * time.Millisecond

// Hold holds requests the throttle would refuse, before their body is read
// (HTTP requests, and refused gRPC streams, whose message waits in their
// flow-control window), and
// decides them again every tick, oldest first, until they are admitted or
// have waited MaxWait (a gRPC stream: most of its deadline); only then are
// they refused.
//
// Why: the OTLP exporters that send to a collector (agents, SDKs) work
// through a fixed number of concurrent requests (sending_queue
// num_consumers) and wait at least their retry back-off (5 s at first, up
// to 30 s) after every refusal, whatever Retry-After says. A refusal during
// a one-second Open therefore idles the sender for seconds, and a wave of
// them idles the collector once it has room again (design §7 has the fleet
// measurements). A held request keeps its sender waiting on the answer
// instead, as HTTP/2 flow control keeps a gRPC sender waiting, and
// costs the collector its goroutine and connection, not its body: the body
// stays unread (in the client and the kernel's socket buffers) until the
// request is admitted.
//
// Admission stays the engine's: a held request is admitted when a fresh
// decision for its signal admits it. Deciding again every tick lets more of
// the held requests in than a single decision would; the engine's CPU
// controller, which integrates, settles on a higher drop probability for
// it, and the memory lines still refuse everything in Open.
//
// One Hold is shared by every server of an extension. A nil *Hold holds
// nothing.
type Hold struct {
	maxWait time.Duration
	maxHeld int64
	tick    time.Duration
	dec     Decider
	// peers bounds the places of one peer to its share of maxHeld, so
	// that a peer flooding the hold holds back no other.
	peers *Peers
	held  atomic.Int64

	mu sync.Mutex
	// waiting per signal, oldest first.
	waiting [decision.NumSignals][]*heldRequest
	// running: the dispatcher goroutine is ticking; it stops when nothing
	// is held.
	running bool
	closed  bool
	// closing is closed by Close: it wakes every held request.
	closing chan struct{}
}

type heldRequest struct {
	// admitted is closed by the dispatcher when the request may go on.
	admitted chan struct{}
	// gone is set by the request when it stops waiting (timeout, client
	// gone), so the dispatcher skips it.
	gone bool
}

// NewHold returns a Hold holding at most maxHeld requests (at most a
// peer's share of them from one peer, see Peers; nil peers: no per-peer
// limit) for at most maxWait each, deciding them with dec every tick
// (DefaultHoldTick when <= 0); nil when maxWait or maxHeld is not
// positive (off).
func NewHold(dec Decider, peers *Peers, maxWait time.Duration, maxHeld int, tick time.Duration) *Hold {
	if maxWait <= 0 || maxHeld <= 0 || dec == nil {
		return nil
	}
	if tick <= 0 {
		tick = DefaultHoldTick
	}
	return &Hold{maxWait: maxWait, maxHeld: int64(maxHeld), tick: tick, dec: dec, peers: peers, closing: make(chan struct{})}
}

// Held returns the number of requests held now (the held_requests gauge).
func (q *Hold) Held() int64 {
	if q == nil {
		return 0
	}
	return q.held.Load()
}

// Wait holds a request of sig from peer p that was decided v (a denial)
// until it is admitted, ctx ends, or MaxWait passes. It returns
// decision.Admit, or the denial to answer with. A full hold (or p at its
// share of it), a closed one or a nil one answers v at once.
func (q *Hold) Wait(ctx context.Context, sig decision.Signal, v decision.Verdict, p peer) decision.Verdict {
	if q == nil || sig >= decision.NumSignals || !q.takeSlot(p) {
		return v
	}
	defer q.freeSlot(p)
	return q.hold(ctx, sig, v, q.maxWait)
}

// hold is Wait for a request that already holds a place (takeSlot), for at
// most limit.
func (q *Hold) hold(ctx context.Context, sig decision.Signal, v decision.Verdict, limit time.Duration) decision.Verdict {
	if limit <= 0 {
		return v
	}
	w := &heldRequest{admitted: make(chan struct{})}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return v
	}
	q.waiting[sig] = append(q.waiting[sig], w)
	if !q.running {
		q.running = true
		go q.dispatch()
	}
	q.mu.Unlock()

	timer := time.NewTimer(limit)
	defer timer.Stop()
	last := false
	select {
	case <-w.admitted:
		return decision.VerdictAdmit
	case <-timer.C:
		last = true
	case <-ctx.Done():
	case <-q.closing:
	}
	q.mu.Lock()
	select {
	case <-w.admitted: // admitted while the lock was awaited
		q.mu.Unlock()
		return decision.VerdictAdmit
	default:
	}
	w.gone = true
	q.mu.Unlock()
	if !last {
		return v
	}
	// One last decision at the end of the wait, as if the request had just
	// arrived; refused, the answer says why it is refused now.
	return q.dec.Decide(sig)
}

// takeSlot takes one of the hold's MaxHeld places for peer p: for a held
// request, and for a gRPC stream from the tap to the end of its wait (see
// GRPC), so that one max_held bounds everything held and the held_requests
// gauge shows it. False when the hold is full, p holds its share of it,
// or the hold is closed or nil.
func (q *Hold) takeSlot(p peer) bool {
	if q == nil {
		return false
	}
	select {
	case <-q.closing:
		return false
	default:
	}
	if q.held.Add(1) > q.maxHeld {
		q.held.Add(-1)
		return false
	}
	if !q.peers.takePlace(p, q.maxHeld) {
		q.held.Add(-1)
		return false
	}
	return true
}

// freeSlot gives back a place taken by takeSlot for p.
func (q *Hold) freeSlot(p peer) {
	q.peers.freePlace(p)
	q.held.Add(-1)
}

// dispatch decides the held requests every tick until none is held. Per
// signal, each held request draws one fresh decision, and as many as were
// admitted go on, oldest first: the same share goes on as if each kept its
// own draw, and no request is overtaken by a younger one.
func (q *Hold) dispatch() {
	t := time.NewTicker(q.tick)
	defer t.Stop()
	for range t.C {
		q.mu.Lock()
		if q.closed {
			q.running = false
			q.mu.Unlock()
			return
		}
		pending := false
		for s := range q.waiting {
			ws := q.waiting[s][:0]
			for _, w := range q.waiting[s] {
				if !w.gone {
					ws = append(ws, w)
				}
			}
			admit := 0
			for range ws {
				if q.dec.Decide(decision.Signal(s)).Admitted() {
					admit++
				}
			}
			for _, w := range ws[:admit] {
				close(w.admitted)
			}
			rest := ws[admit:]
			// Keep the backing array from growing for ever.
			q.waiting[s] = append(q.waiting[s][:0], rest...)
			pending = pending || len(rest) > 0
		}
		if !pending {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// Close refuses every held request at once and holds no more: the
// receivers are shutting down.
func (q *Hold) Close() {
	if q == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.closed = true
	close(q.closing)
	for s := range q.waiting {
		for _, w := range q.waiting[s] {
			w.gone = true
		}
		q.waiting[s] = nil
	}
}

// maxWaitOr is the hold's max_wait, or d when the hold is off.
func (q *Hold) maxWaitOr(d time.Duration) time.Duration {
	if q == nil {
		return d
	}
	return q.maxWait
}
