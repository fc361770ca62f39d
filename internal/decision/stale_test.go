// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package decision

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExpire(t *testing.T) {
	const maxAge = 5 * time.Second
	clock := newClock()
	var transitions []Transition
	e := New(testConfig(1, 1), Options{
		Now:          clock.Now,
		OnTransition: func(tr Transition) { transitions = append(transitions, tr) },
	})
	e.Observe(memOnly(0.95).level())
	require.Equal(t, StateOpen, e.State(SignalTraces))
	require.Len(t, transitions, int(NumSignals))
	transitions = nil

	clock.Advance(maxAge - time.Nanosecond)
	assert.False(t, e.Expire(maxAge), "younger than maxAge")
	assert.False(t, e.Stale())
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalTraces))

	clock.Advance(time.Nanosecond)
	assert.True(t, e.Expire(maxAge), "maxAge old")
	assert.True(t, e.Stale())
	assert.True(t, e.Expire(maxAge), "stays stale without Observe")
	for s := range NumSignals {
		assert.Equal(t, VerdictAdmit, e.Decide(s), s.String())
		assert.Equal(t, StateNormal, e.State(s), s.String())
	}
	st := e.Stat()
	assert.True(t, st.Stale)
	for s := range NumSignals {
		assert.Zero(t, st.Signals[s].DropProbability)
	}
	assert.InDelta(t, 0.95, st.Level.Mem, 0, "the last level is still reported")
	assert.Empty(t, transitions, "the fallback is not a transition")

	// The first fresh frame restores the real snapshots: still over hard,
	// the machine was kept in Open, so it rejects at once.
	e.Observe(memOnly(0.95).level())
	assert.False(t, e.Stale())
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalTraces))
	assert.Equal(t, StateOpen, e.State(SignalTraces))
	assert.Empty(t, transitions)
	assert.False(t, e.Expire(maxAge), "fresh again")
	assert.Equal(t, clock.Now(), e.ObservedAt())
}

func TestExpireRecoversToTheFrameState(t *testing.T) {
	clock := newClock()
	e := New(testConfig(1, 1), Options{Now: clock.Now})
	e.Observe(memOnly(0.95).level())
	clock.Advance(time.Minute)
	require.True(t, e.Expire(time.Second))
	// A calm frame after the gap: Open -> Normal, as without the gap.
	e.Observe(memOnly(0.5).level())
	assert.Equal(t, StateNormal, e.State(SignalTraces))
	assert.Equal(t, VerdictAdmit, e.Decide(SignalTraces))
}

func TestExpireBreaksStreaks(t *testing.T) {
	clock := newClock()
	e := New(testConfig(3, 1), Options{Now: clock.Now})
	assert.Equal(t, "NN", feed(e, cpuEnter, cpuEnter))
	clock.Advance(time.Minute)
	require.True(t, e.Expire(time.Second))
	// Two frames before the gap and one after are not three in a row.
	assert.Equal(t, "NNS", feed(e, cpuEnter, cpuEnter, cpuEnter))
}

func TestExpireDisabled(t *testing.T) {
	clock := newClock()
	e := New(testConfig(1, 1), Options{Now: clock.Now})
	e.Observe(memOnly(0.95).level())
	clock.Advance(24 * time.Hour)
	assert.False(t, e.Expire(0), "0 = hold for ever")
	assert.False(t, e.Expire(-time.Second))
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalTraces))
}

func TestExpireBeforeFirstObserve(t *testing.T) {
	clock := newClock()
	e := New(linesConfig(), Options{Now: clock.Now})
	assert.False(t, e.Expire(time.Second))
	clock.Advance(time.Second)
	assert.True(t, e.Expire(time.Second), "no level at all for maxAge is stale too")
	assert.Equal(t, VerdictAdmit, e.Decide(SignalTraces))
}

// TestExpireConcurrentWithObserve runs the watchdog's call against a live
// Observe under -race. Whatever the interleaving, once Observe has returned
// with a hard frame and no Expire can find it old, Decide rejects.
func TestExpireConcurrentWithObserve(t *testing.T) {
	e := New(testConfig(1, 1), Options{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				e.Expire(time.Nanosecond)
				_ = e.Decide(SignalTraces)
				_ = e.Stat()
			}
		}
	})
	for range 2000 {
		e.Observe(memOnly(0.95).level())
	}
	close(stop)
	wg.Wait()
	e.Observe(memOnly(0.95).level())
	assert.False(t, e.Expire(time.Hour))
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalTraces))
}

func BenchmarkDecideAfterExpire(b *testing.B) {
	clock := newClock()
	e := New(testConfig(1, 1), Options{Now: clock.Now})
	e.Observe(memOnly(0.95).level())
	clock.Advance(time.Minute)
	require.True(b, e.Expire(time.Second))
	b.ReportAllocs()
	for b.Loop() {
		sink = e.Decide(SignalTraces)
	}
}
