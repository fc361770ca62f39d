// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package statuspage serves the throttle's live status: a JSON view of the
// current water level, thresholds, per-signal states and counters, and a small
// self-contained HTML page charting the last minutes from an in-memory ring of
// samples.
//
// The extension records a Sample on every published water level; Server
// serves Handler on its optional status endpoint (a confighttp server
// setting), from its Start to its Shutdown. The ring and the handler are free
// of collector types.
package statuspage // import "github.com/otelthrottle/throttle/internal/statuspage"

import (
	"sync"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

const (
	// Window is how far back the ring and the page look.
	Window = 10 * time.Minute
	// MaxCapacity bounds the ring (about 100 bytes a sample). A sample
	// interval shorter than Window/MaxCapacity (125 ms) is thinned out by
	// NewRingFor rather than growing the ring.
	MaxCapacity = 4800
	// minCapacity keeps a ring useful with absurdly long intervals.
	minCapacity = 16
)

// Sample is one point of history, recorded on every published water level.
//
// Allowed and Denied are cumulative totals (all signals, all protocols, every
// denial reason) since the extension started, not per-interval deltas: a
// thinned-out or missed sample then loses no counts, and the page derives the
// per-second rates from the differences between consecutive samples (a total
// that goes down is a counter reset and breaks the line).
type Sample struct {
	At time.Time
	// Levels are the resources' levels, in the order of Info.Resources.
	Levels [sampler.MaxResources]SampleLevel
	// WorkingSet is the working set's share of the memory limit, beside
	// the memory level (the one the lines apply to, with the heap
	// corrections).
	WorkingSet float64
	States     [decision.NumSignals]decision.State
	Allowed    uint64
	Denied     uint64
}

// SampleLevel is one resource's level in a Sample: single precision, as
// the page draws it, which keeps the ring small.
type SampleLevel struct {
	Value, Slow, Fast float32
	Valid             bool
}

// SampleLevels are levels as a Sample keeps them.
func SampleLevels(levels *[sampler.MaxResources]sampler.Level) [sampler.MaxResources]SampleLevel {
	var out [sampler.MaxResources]SampleLevel
	for i := range levels {
		l := &levels[i]
		out[i] = SampleLevel{Value: float32(l.Value), Slow: float32(l.Slow), Fast: float32(l.Fast), Valid: l.Valid}
	}
	return out
}

// Ring is a fixed-size, preallocated ring buffer of samples, safe for
// concurrent use. Record is called by the sampler goroutine a few times a
// second and Snapshot on page refreshes, so a plain mutex is enough.
type Ring struct {
	mu     sync.Mutex
	buf    []Sample
	next   int // index the next Record writes
	n      int // number of valid entries, <= len(buf)
	minGap time.Duration
	due    time.Time // with minGap: the next sample is kept at or after due
}

// NewRing returns a ring holding the last capacity samples (at least 1).
func NewRing(capacity int) *Ring {
	if capacity < 1 {
		capacity = 1
	}
	return &Ring{buf: make([]Sample, capacity)}
}

// NewRingFor returns a ring covering Window at the given sample interval:
// Window/interval entries (2400 at 250 ms), at least 16 and at most
// MaxCapacity. When the cap applies, Record keeps one sample per
// Window/MaxCapacity (125 ms) and drops the others, so the ring still spans
// the whole window. The cumulative counters make thinning lossless for
// the rates; a state held for less than that gap may not show.
func NewRingFor(interval time.Duration) *Ring {
	if interval <= 0 {
		interval = 250 * time.Millisecond
	}
	capacity := int(Window / interval)
	var minGap time.Duration
	switch {
	case capacity > MaxCapacity:
		capacity = MaxCapacity
		minGap = Window / MaxCapacity
	case capacity < minCapacity:
		capacity = minCapacity
	}
	r := NewRing(capacity)
	r.minGap = minGap
	return r
}

// Cap returns the ring's capacity.
func (r *Ring) Cap() int { return len(r.buf) }

// Len returns the number of samples held.
func (r *Ring) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// MinGap returns the minimum spacing Record keeps between samples (0: every
// sample is kept).
func (r *Ring) MinGap() time.Duration { return r.minGap }

// Record stores s, overwriting the oldest sample when the ring is full. It
// does not allocate. Samples are expected in time order (the sampler's
// monotonic clock); Snapshot relies on it.
func (r *Ring) Record(s Sample) {
	r.mu.Lock()
	if r.minGap > 0 {
		if r.n > 0 && s.At.Before(r.due) {
			r.mu.Unlock()
			return
		}
		// Advance due on a grid of minGap rather than from s.At, so timer
		// jitter does not stretch the spacing (and the ring's span).
		if r.n == 0 || s.At.Sub(r.due) >= r.minGap {
			r.due = s.At
		}
		r.due = r.due.Add(r.minGap)
	}
	r.buf[r.next] = s
	r.next++
	if r.next == len(r.buf) {
		r.next = 0
	}
	if r.n < len(r.buf) {
		r.n++
	}
	r.mu.Unlock()
}

// After returns a copy of at most limit samples taken strictly after since,
// oldest first, and whether samples after the last one returned were left
// out (more): a reader pages forward by passing back the time of the last
// sample it got. A zero since starts at the oldest sample held.
func (r *Ring) After(since time.Time, limit int) (samples []Sample, more bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Walk back from the newest sample: a page refresh asks for the few
	// samples since its last fetch, so this stops early.
	k := 0
	for k < r.n && r.at(r.n-1-k).At.After(since) {
		k++
	}
	n := min(k, max(limit, 0))
	return r.copyFrom(r.n-k, n), k > n
}

// Last returns a copy of the newest limit samples (all of them when the
// ring holds fewer), oldest first.
func (r *Ring) Last(limit int) []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := min(r.n, max(limit, 0))
	return r.copyFrom(r.n-k, k)
}

// copyFrom copies k held samples from the i-th. Callers hold r.mu.
func (r *Ring) copyFrom(i, k int) []Sample {
	out := make([]Sample, k)
	for j := range out {
		out[j] = *r.at(i + j)
	}
	return out
}

// at returns the i-th held sample, 0 being the oldest. Callers hold r.mu.
func (r *Ring) at(i int) *Sample {
	start := r.next - r.n
	if start < 0 {
		start += len(r.buf)
	}
	j := start + i
	if j >= len(r.buf) {
		j -= len(r.buf)
	}
	return &r.buf[j]
}
