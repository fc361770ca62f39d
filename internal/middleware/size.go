// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// epoch is the origin of the monotonic clock the middleware measures ages
// and windows on (time.Since reads the monotonic clock).
var epoch = time.Now()

// now is the time since epoch.
func now() time.Duration { return time.Since(epoch) }

// sizeWindowLen is the length of one window of a sizeWindow: the estimate
// remembers the largest size of the last one to two windows, long enough to
// span several batches of a periodic exporter, short enough to follow a
// change of workload within half a minute.
const sizeWindowLen = 10 * time.Second

// sizeWindow learns the largest size seen recently: the maximum of the
// current window and the previous one. Unlike an average, small or empty
// requests cannot pull it down while large ones keep arriving, and one
// large request weighs as much as it costs. It is lock-free; a lost race
// drops at most one sample into the previous window, which an estimate can
// afford. The zero value is ready: 0 means no data.
type sizeWindow struct {
	index atomic.Int64 // window that cur belongs to
	cur   atomic.Int64
	prev  atomic.Int64
}

func (w *sizeWindow) roll(t time.Duration) {
	i := int64(t / sizeWindowLen)
	old := w.index.Load()
	if i <= old || !w.index.CompareAndSwap(old, i) {
		return
	}
	c := w.cur.Swap(0)
	if i == old+1 {
		w.prev.Store(c)
	} else {
		w.prev.Store(0) // a window without any size in between: forget
	}
}

// observe feeds one size at time t. 0 counts as 1: an empty request is data
// too.
func (w *sizeWindow) observe(n int64, t time.Duration) {
	w.roll(t)
	n = max(n, 1)
	for {
		c := w.cur.Load()
		if n <= c || w.cur.CompareAndSwap(c, n) {
			return
		}
	}
}

// get returns the largest size of the current and the previous window at
// time t, 0 if none.
func (w *sizeWindow) get(t time.Duration) int64 {
	w.roll(t)
	return max(w.cur.Load(), w.prev.Load())
}

// peerSizes learns sizes per peer slot and signal: what one peer sends says
// nothing of what another will, and a peer that sends large (or
// amplifying) requests raises only its own reservations. A slot's windows
// are allocated the first time one of its requests is learnt from; slot 0
// (no peer: not an IP address) has its own.
type peerSizes struct {
	slots [peerSlots + 1]atomic.Pointer[[decision.NumSignals]sizeWindow]
}

// get returns the largest size learnt for p and sig in the current and the
// previous window at t, 0 if none.
func (s *peerSizes) get(p peer, sig decision.Signal, t time.Duration) int64 {
	w := s.slots[p].Load()
	if w == nil || sig >= decision.NumSignals {
		return 0
	}
	return w[sig].get(t)
}

// observe feeds one size of p and sig at t.
func (s *peerSizes) observe(p peer, sig decision.Signal, n int64, t time.Duration) {
	if sig >= decision.NumSignals {
		return
	}
	w := s.slots[p].Load()
	if w == nil {
		w = new([decision.NumSignals]sizeWindow)
		if !s.slots[p].CompareAndSwap(nil, w) {
			w = s.slots[p].Load()
		}
	}
	w[sig].observe(n, t)
}
