// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"sync/atomic"
	"time"
)

// epoch is the origin of the monotonic clock ages and windows are measured
// on (time.Since reads the monotonic clock).
var epoch = time.Now()

// now is the time since epoch. Tests that need another clock set nowFn.
func now() time.Duration { return time.Since(epoch) }

// counter counts events (bytes, requests) in windows of a fixed length:
// the current window and the one before it, enough for a rate that one
// burst moves only for a window or two. Lock-free; a count added while
// the window turns may land in either window: a rate, not a ledger.
type counter struct {
	window    atomic.Int64 // index of the current window
	cur, prev atomic.Int64
}

// reset forgets every count.
func (c *counter) reset() {
	c.window.Store(0)
	c.cur.Store(0)
	c.prev.Store(0)
}

// add counts n at t, in windows of length w.
func (c *counter) add(n int64, t, w time.Duration) {
	c.roll(t, w)
	c.cur.Add(n)
}

// recent is what was counted in the current window and the one before it.
func (c *counter) recent(t, w time.Duration) int64 {
	c.roll(t, w)
	return c.cur.Load() + c.prev.Load()
}

// roll starts the window of t if it has not started yet.
func (c *counter) roll(t, w time.Duration) {
	idx := int64(t / w)
	old := c.window.Load()
	if idx <= old || !c.window.CompareAndSwap(old, idx) {
		return
	}
	if idx == old+1 {
		c.prev.Store(c.cur.Swap(0))
		return
	}
	c.prev.Store(0)
	c.cur.Store(0)
}

// sizeWindowLen is the length of one window of a sizeWindow: the estimate
// remembers the largest size of the last one to two windows, long enough to
// span several batches of a periodic exporter, short enough to follow a
// change of workload within half a minute.
const sizeWindowLen = 10 * time.Second

// sizeWindow learns the largest size seen recently: the maximum of the
// current window and the previous one. Unlike an average, small or empty
// requests cannot pull it down while large ones keep arriving. Lock-free;
// a lost race drops at most one sample into the previous window, which an
// estimate can afford. The zero value is ready: 0 means no data.
type sizeWindow struct {
	index atomic.Int64
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

// observe feeds one size at t; 0 counts as 1: an empty request is data too.
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
// t, 0 if none.
func (w *sizeWindow) get(t time.Duration) int64 {
	w.roll(t)
	return max(w.cur.Load(), w.prev.Load())
}
