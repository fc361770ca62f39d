// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// holdTick is how often held requests are decided again.
const holdTick = 100 * time.Millisecond

// hold holds requests the throttle would refuse, before their body is read
// (HTTP requests, and refused gRPC calls, whose message waits in their
// flow-control window), and decides them again every tick, oldest first,
// until they are admitted or have waited long enough; only then are they
// refused.
//
// Why: the OTLP exporters that send to a collector work through a fixed
// number of concurrent requests and wait at least their retry back-off (5 s
// at first) after every refusal, whatever Retry-After says. A refusal
// during a one-second Open therefore idles the sender for seconds, and a
// wave of them idles the collector once it has room again. A held request
// keeps its sender waiting on the answer instead, and costs the collector
// its goroutine and connection, not its body: the body stays unread until
// the request is admitted.
//
// Admission stays the engine's: a held request is admitted when a fresh
// decision for its key and signal admits it. Each key holds at most its
// share of the places (keyTable), so that a key flooding the hold holds
// back no other.
type hold struct {
	c       *Controller
	maxWait time.Duration
	maxHeld int64
	held    atomic.Int64

	mu      sync.Mutex
	waiting [decision.NumSignals][]*heldRequest // oldest first
	running bool                                // the dispatcher is ticking
	closed  bool
	closing chan struct{} // closed by close: wakes every held request
}

type heldRequest struct {
	key      Key
	admitted chan struct{} // closed by the dispatcher when it may go on
	gone     bool          // it stopped waiting: the dispatcher skips it
}

// newHold returns a hold of cfg, nil when it is off.
func newHold(c *Controller, cfg HoldConfig) *hold {
	if cfg.MaxWait <= 0 || cfg.MaxRequests <= 0 {
		return nil
	}
	return &hold{c: c, maxWait: cfg.MaxWait, maxHeld: int64(cfg.MaxRequests), closing: make(chan struct{})}
}

// count is the number of requests held now.
func (h *hold) count() int64 {
	if h == nil {
		return 0
	}
	return h.held.Load()
}

// dispatch decides the held requests every tick until none is held, each
// with a fresh decision for its key, oldest first.
func (h *hold) dispatch() {
	t := time.NewTicker(holdTick)
	defer t.Stop()
	for range t.C {
		h.mu.Lock()
		if h.closed {
			h.running = false
			h.mu.Unlock()
			return
		}
		pending := false
		for s := range h.waiting {
			rest := h.waiting[s][:0]
			for _, w := range h.waiting[s] {
				switch {
				case w.gone:
				case h.c.decide(w.key, decision.Signal(s)).Admitted():
					close(w.admitted)
				default:
					rest = append(rest, w)
				}
			}
			clear(h.waiting[s][len(rest):])
			h.waiting[s] = rest
			pending = pending || len(rest) > 0
		}
		if !pending {
			h.running = false
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
	}
}

// close refuses every held request at once and holds no more: the
// receivers are stopping.
func (h *hold) close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	close(h.closing)
	for s := range h.waiting {
		for _, w := range h.waiting[s] {
			w.gone = true
		}
		h.waiting[s] = nil
	}
}

// maxWaitOr is the hold's max_wait, or d when the hold is off.
func (h *hold) maxWaitOr(d time.Duration) time.Duration {
	if h == nil {
		return d
	}
	return h.maxWait
}
