// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"sync/atomic"
	"time"
)

// stallAfter is how long an uninterrupted Open has to last to count as a
// stall: a memory Open normally ends within seconds, as soon as the
// pipeline has drained what it holds; one that lasts longer means the
// collector cannot drain (an exporter stuck or too slow, a queue that does
// not shrink), which an operator has to see rather than infer.
const stallAfter = 30 * time.Second

// openWatch times the state machine's Open episodes. observe runs on the
// sampler goroutine; openFor and stalled are safe from any goroutine (the
// metric callbacks and the component status read them).
type openWatch struct {
	// since is the start of the current Open in unix nanoseconds, 0 when
	// the machine is not Open.
	since   atomic.Int64
	stall   atomic.Bool
	nowFunc func() time.Time
}

func (w *openWatch) now() time.Time {
	if w.nowFunc != nil {
		return w.nowFunc()
	}
	return time.Now()
}

// observe records whether the machine is Open after a sample, and reports
// whether the stall started (true once per episode) or ended, and how long
// the episode lasted when it ended.
func (w *openWatch) observe(open bool) (stallStarted bool, ended time.Duration) {
	now := w.now()
	since := w.since.Load()
	switch {
	case open && since == 0:
		w.since.Store(now.UnixNano())
	case open && !w.stall.Load() && now.Sub(time.Unix(0, since)) >= stallAfter:
		w.stall.Store(true)
		return true, 0
	case !open && since != 0:
		w.since.Store(0)
		if w.stall.Swap(false) {
			return false, now.Sub(time.Unix(0, since))
		}
	}
	return false, 0
}

// openFor is how long the current Open has lasted; 0 when not Open.
func (w *openWatch) openFor() time.Duration {
	since := w.since.Load()
	if since == 0 {
		return 0
	}
	return w.now().Sub(time.Unix(0, since))
}

// stalled reports whether the current Open has lasted stallAfter or more.
func (w *openWatch) stalled() bool { return w.stall.Load() }
