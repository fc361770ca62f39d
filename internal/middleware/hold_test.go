// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

const (
	testTick = 2 * time.Millisecond
	// long is a wait no test should reach: it only bounds a failing one.
	long = 10 * time.Second
)

func TestHoldOff(t *testing.T) {
	dec := &fakeDecider{}
	assert.Nil(t, NewHold(dec, nil, 0, 10, 0))
	assert.Nil(t, NewHold(dec, nil, time.Second, 0, 0))
	var q *Hold
	assert.Equal(t, decision.VerdictDenyShed, q.Wait(context.Background(), decision.SignalTraces, decision.VerdictDenyShed, 0))
	assert.Zero(t, q.Held())
	q.Close()
}

// waitResult runs Wait for traces on its own goroutine.
func waitResult(ctx context.Context, q *Hold, v decision.Verdict) <-chan decision.Verdict {
	out := make(chan decision.Verdict, 1)
	go func() { out <- q.Wait(ctx, decision.SignalTraces, v, 0) }()
	return out
}

func heldEventually(t *testing.T, q *Hold, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return q.Held() == n }, long, time.Millisecond, "held %d, want %d", q.Held(), n)
}

func TestHoldAdmitsWhenTheDecisionDoes(t *testing.T) {
	dec := &fakeDecider{}
	dec.setAll(decision.VerdictDenyOpen)
	q := NewHold(dec, nil, long, 10, testTick)
	got := waitResult(context.Background(), q, decision.VerdictDenyOpen)
	heldEventually(t, q, 1)
	select {
	case v := <-got:
		t.Fatalf("answered %v while the decision still refuses", v)
	case <-time.After(20 * testTick):
	}
	dec.set(decision.SignalTraces, decision.VerdictAdmit)
	select {
	case v := <-got:
		assert.Equal(t, decision.VerdictAdmit, v)
	case <-time.After(long):
		t.Fatal("not admitted")
	}
	heldEventually(t, q, 0)
}

func TestHoldRefusesAfterMaxWait(t *testing.T) {
	dec := &fakeDecider{}
	dec.setAll(decision.VerdictDenyShed)
	q := NewHold(dec, nil, 30*time.Millisecond, 10, testTick)
	start := time.Now()
	// The last decision's denial is the answer: Open now, though the
	// request was first refused for shedding.
	dec.set(decision.SignalLogs, decision.VerdictDenyOpen)
	assert.Equal(t, decision.VerdictDenyOpen, q.Wait(context.Background(), decision.SignalLogs, decision.VerdictDenyShed, 0))
	assert.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	assert.Zero(t, q.Held())
}

func TestHoldFull(t *testing.T) {
	dec := &fakeDecider{}
	dec.setAll(decision.VerdictDenyShed)
	q := NewHold(dec, nil, long, 2, testTick)
	ctx, cancel := context.WithCancel(context.Background())
	a := waitResult(ctx, q, decision.VerdictDenyShed)
	b := waitResult(ctx, q, decision.VerdictDenyShed)
	heldEventually(t, q, 2)
	// The third is answered at once, with the denial it came with.
	assert.Equal(t, decision.VerdictDenyBudget, q.Wait(context.Background(), decision.SignalTraces, decision.VerdictDenyBudget, 0))
	cancel()
	// A client gone: the held requests stop waiting at once.
	assert.Equal(t, decision.VerdictDenyShed, <-a)
	assert.Equal(t, decision.VerdictDenyShed, <-b)
	heldEventually(t, q, 0)
}

// orderedDecider admits exactly one call in every n, counted over all
// signals.
type orderedDecider struct {
	n     atomic.Int64
	calls atomic.Int64
}

func (d *orderedDecider) Decide(decision.Signal) decision.Verdict {
	if d.calls.Add(1)%d.n.Load() == 0 {
		return decision.VerdictAdmit
	}
	return decision.VerdictDenyShed
}

func (*orderedDecider) Exempt(decision.Signal) bool { return false }

func (*orderedDecider) Pressed(decision.Signal) bool { return true }

// TestHoldOldestFirst: requests are admitted in the order they arrived,
// whichever of their draws admitted.
func TestHoldOldestFirst(t *testing.T) {
	dec := &orderedDecider{}
	dec.n.Store(1 << 62) // admits nothing until n changes
	q := NewHold(dec, nil, long, 10, testTick)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if q.Wait(context.Background(), decision.SignalMetrics, decision.VerdictDenyShed, 0) == decision.VerdictAdmit {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
			}
		})
		// Arrival order is the order Wait appends in.
		heldEventually(t, q, int64(i+1))
	}
	dec.n.Store(4) // about one admission a tick
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(long):
		t.Fatal("not all admitted")
	}
	assert.Equal(t, []int{0, 1, 2, 3}, order)
}

func TestHoldClose(t *testing.T) {
	dec := &fakeDecider{}
	dec.setAll(decision.VerdictDenyOpen)
	q := NewHold(dec, nil, long, 10, testTick)
	a := waitResult(context.Background(), q, decision.VerdictDenyOpen)
	heldEventually(t, q, 1)
	q.Close()
	select {
	case v := <-a:
		assert.Equal(t, decision.VerdictDenyOpen, v)
	case <-time.After(long):
		t.Fatal("Close did not wake the held request")
	}
	// Closed: nothing is held any more.
	assert.Equal(t, decision.VerdictDenyShed, q.Wait(context.Background(), decision.SignalTraces, decision.VerdictDenyShed, 0))
	q.Close()
}
