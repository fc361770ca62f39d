// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

func TestBudget(t *testing.T) {
	b := NewBudget(100)
	require.NotNil(t, b)
	hw := b.WatchHighWater()
	assert.EqualValues(t, 100, b.Max())
	assert.True(t, b.Reserve(60))
	assert.False(t, b.Reserve(41))
	assert.True(t, b.Reserve(40))
	assert.False(t, b.Reserve(1))
	assert.True(t, b.Reserve(0), "nothing always fits")
	assert.False(t, b.Reserve(math.MaxInt64), "no overflow")
	assert.EqualValues(t, 100, b.Reserved())
	b.Release(60)
	assert.EqualValues(t, 40, b.Reserved())
	assert.False(t, b.Reserve(math.MaxInt64))
	b.Release(40)
	assert.Zero(t, b.Reserved())
	assert.EqualValues(t, 100, hw.Load())
}

func TestBudgetNil(t *testing.T) {
	assert.Nil(t, NewBudget(0))
	assert.Nil(t, NewBudget(-1))
	var b *Budget
	assert.True(t, b.Reserve(math.MaxInt64))
	b.Release(10)
	assert.Zero(t, b.Reserved())
	assert.Zero(t, b.Max())
	assert.Zero(t, b.WatchHighWater().Load())
}

func TestBudgetConcurrent(t *testing.T) {
	const maxBytes = 1000
	b := NewBudget(maxBytes)
	hw := b.WatchHighWater()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				n := int64(1 + (g*31+i*7)%300)
				if b.Reserve(n) {
					assert.LessOrEqual(t, b.Reserved(), int64(maxBytes))
					b.Release(n)
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, b.Reserved())
	assert.LessOrEqual(t, hw.Load(), int64(maxBytes))
	assert.Positive(t, hw.Load())
}

// TestBudgetExemptOverdraft: an exempt signal's request may take the
// budget and its peer's share over by as much again, no further, ahead of
// the requests waiting in line; the others may not.
func TestBudgetExemptOverdraft(t *testing.T) {
	b := NewBudgetWith(BudgetConfig{Max: 800, PeerShare: 0.5, Wait: time.Second})
	p := b.peerOfRemote("127.0.0.2:1")
	b.Peers().touch(p, now())
	lim := b.maxFor(p)
	require.True(t, b.admit(lim, p), "the peer fills its share")
	assert.False(t, b.admit(1, p), "an ordinary request is refused at the share")
	assert.True(t, b.admitExempt(lim, p), "an exempt one takes the share over by as much again")
	assert.False(t, b.admitExempt(1, p), "no further")
	b.release(2*lim, p)

	require.True(t, b.Reserve(800), "another fills the budget")
	assert.False(t, b.admit(1, p))
	assert.True(t, b.admitExempt(lim, p), "an exempt request takes the budget over, within its peer's")
	b.Peers().touch(b.peerOfRemote("127.0.0.3:1"), now())
	q := b.peerOfRemote("127.0.0.3:1")
	assert.True(t, b.admitExempt(800-lim, q))
	assert.False(t, b.admitExempt(1, q), "no further than a second budget")
	assert.EqualValues(t, 1600, b.Reserved())
	b.release(lim, p)
	b.release(800-lim, q)
	b.Release(800)
	assert.Zero(t, b.Reserved())
	assert.True(t, b.admitExempt(0, p), "nothing always fits")
	var nb *Budget
	assert.True(t, nb.admitExempt(math.MaxInt64, p), "no budget")
}

// TestRetryDelay: the hint follows why a request was refused, always in
// whole seconds within the range: a budget refusal 1 s, a shed one a short
// draw (up to 2 s), an Open one between half and all of how long the Open
// has lasted, so that a client whose whole export must fit in 10 s is
// never told to wait longer than the Open is likely to last.
func TestRetryDelay(t *testing.T) {
	draws := func(d *RetryDelay, v decision.Verdict) map[time.Duration]int {
		seen := map[time.Duration]int{}
		for range 2000 {
			got := d.Draw(v)
			require.Zero(t, got%time.Second, "whole seconds")
			seen[got]++
		}
		return seen
	}
	keys := func(m map[time.Duration]int) []time.Duration { return slices.Sorted(maps.Keys(m)) }
	s := time.Second

	var open time.Duration
	d := NewRetryDelay(DefaultRetryFloor, DefaultRetryCeiling, func() time.Duration { return open }, nil)
	assert.Equal(t, []time.Duration{1 * s, 2 * s}, keys(draws(d, decision.VerdictDenyShed)), "shed: short")
	assert.Equal(t, BudgetRetryDelay, d.Draw(decision.VerdictDenyBudget))
	assert.Zero(t, d.Draw(decision.VerdictAdmit))
	open = 300 * time.Millisecond
	assert.Equal(t, []time.Duration{1 * s}, keys(draws(d, decision.VerdictDenyOpen)), "a new Open: the minimum")
	open = 4 * s
	assert.Equal(t, []time.Duration{2 * s, 3 * s, 4 * s}, keys(draws(d, decision.VerdictDenyOpen)), "half to all of its age")
	open = time.Minute
	assert.Equal(t, []time.Duration{3 * s, 4 * s, 5 * s}, keys(draws(d, decision.VerdictDenyOpen)), "capped at max")

	// Without openFor an Open hint is drawn from the whole range; the
	// bounds clamp every kind.
	wide := NewRetryDelay(2*s, 30*s, nil, nil)
	assert.Len(t, draws(wide, decision.VerdictDenyOpen), 29)
	assert.Equal(t, []time.Duration{2 * s}, keys(draws(wide, decision.VerdictDenyShed)), "shed clamped up to min")
	assert.Equal(t, 2*s, wide.Draw(decision.VerdictDenyBudget), "budget clamped up to min")
	lo := NewRetryDelay(0, 30*s, nil, func(int64) int64 { return 0 })
	hi := NewRetryDelay(0, 30*s, nil, func(n int64) int64 { return n - 1 })
	assert.Zero(t, lo.Draw(decision.VerdictDenyOpen))
	assert.Equal(t, 30*s, hi.Draw(decision.VerdictDenyOpen))

	// Rounding: min up, max down, max below min collapses to min.
	r := NewRetryDelay(1500*time.Millisecond, 1700*time.Millisecond, nil, nil)
	assert.Equal(t, 2*s, r.Draw(decision.VerdictDenyOpen))
	z := NewRetryDelay(-s, 0, nil, nil)
	assert.Zero(t, z.Draw(decision.VerdictDenyOpen))
	assert.Zero(t, z.Draw(decision.VerdictDenyBudget), "budget delay clamped down to max")
}

// TestBudgetWaitAdmit: a request that finds the budget full waits for the
// bytes: released bytes go to the waiting requests oldest first, a new
// request does not pass them, a waiting request whose peer is at its share
// is passed over (a flooding peer cannot hold the others back), and when
// the oldest gives up, those behind it that fit are admitted at once.
func TestBudgetWaitAdmit(t *testing.T) {
	const long = 10 * time.Second
	b := NewBudgetWith(BudgetConfig{Max: 100, PeerShare: 0.5})
	peerA := b.peerOfRemote("10.0.0.1:1")
	peerB := peerPast(b, peerA)
	peerC := peerPast(b, peerA, peerB)
	results := make(chan string, 4)
	// wait starts a waiting request and returns once it waits; cancel
	// ends its wait.
	wait := func(name string, n int64, p peer) (cancel func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		before := b.entering.Load()
		go func() {
			if b.waitAdmit(ctx, n, p, long) {
				results <- name
			} else {
				results <- name + " refused"
			}
		}()
		require.Eventually(t, func() bool { return b.entering.Load() == before+1 }, long, time.Millisecond)
		return cancel
	}

	require.True(t, b.admit(50, peerA))
	require.True(t, b.admit(50, peerC))
	cancelA := wait("A", 10, peerA)
	wait("B", 30, peerB)
	b.release(50, peerC)
	assert.Equal(t, "B", <-results, "A is at its share: B, younger, gets the bytes")
	cancelA()
	assert.Equal(t, "A refused", <-results)
	assert.EqualValues(t, 80, b.Reserved())

	// Oldest first, and no new request passes those waiting: 20 are free,
	// but C, waiting for 30, is first in line.
	cancelC := wait("C", 30, peerC)
	wait("B2", 20, peerB)
	assert.False(t, b.admit(10, peerB), "a new request does not pass those waiting")
	assert.EqualValues(t, 80, b.Reserved())
	// C gives up: B2, behind it, fits and is admitted at once.
	cancelC()
	assert.ElementsMatch(t, []string{"C refused", "B2"}, []string{<-results, <-results}, "in either order: two goroutines answer")
	assert.EqualValues(t, 100, b.Reserved())
	assert.Zero(t, b.entering.Load())
	assert.Empty(t, b.entrants)

	assert.False(t, b.waitAdmit(context.Background(), 10, peerC, 0), "no wait: refused at once")
	b.release(50, peerA)
	b.release(50, peerB)
	assert.Zero(t, b.Reserved())
	assert.True(t, b.admit(10, peerC), "nobody waits: admitted at once")
}

// peerPast returns the slot of an address that is none of avoid, whatever
// the seed.
func peerPast(b *Budget, avoid ...peer) peer {
	for i := 3; ; i++ {
		if p := b.peerOfRemote(fmt.Sprintf("10.1.%d.%d:1", i/250, i%250)); !slices.Contains(avoid, p) {
			return p
		}
	}
}

// TestReadCounter: what was read in the current window and the one before
// it; older windows are forgotten.
func TestReadCounter(t *testing.T) {
	var c readCounter
	c.add(100, 0)
	c.add(10, laneWindow/2)
	assert.EqualValues(t, 110, c.recent(laneWindow-1))
	c.add(5, laneWindow)
	assert.EqualValues(t, 115, c.recent(laneWindow+1), "the window before counts")
	assert.EqualValues(t, 5, c.recent(2*laneWindow), "two windows on, only the last")
	assert.Zero(t, c.recent(4*laneWindow), "after a gap, nothing")
	c.add(7, 4*laneWindow)
	assert.EqualValues(t, 7, c.recent(5*laneWindow-1))
}
