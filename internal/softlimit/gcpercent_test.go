// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package softlimit

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeGCPercent stands in for debug.SetGCPercent.
type fakeGCPercent struct {
	percent int
	calls   []int
}

func (f *fakeGCPercent) set(v int) int {
	prev := f.percent
	f.percent = v
	f.calls = append(f.calls, v)
	return prev
}

func (f *fakeGCPercent) options(vars map[string]string) GCPercentOptions {
	return GCPercentOptions{SetGCPercent: f.set, Getenv: env(vars), Current: func() int { return f.percent }}
}

func TestGCPercentFor(t *testing.T) {
	f := func(target float64, h HeapFigures, want int) {
		t.Helper()
		assert.Equal(t, want, GCPercentFor(target, h), "target %v, %+v", target, h)
	}
	// 150 MiB target, 20 MiB live and 5 MiB of roots: 20 + 25 × 5.2 = 150.
	f(150*mib, HeapFigures{Live: 20 * mib, Stacks: 4 * mib, Globals: 1 * mib}, 520)
	// What is live already fills half the target: GOGC's default, never less.
	f(150*mib, HeapFigures{Live: 75 * mib}, 100)
	f(150*mib, HeapFigures{Live: 140 * mib}, 100)
	f(150*mib, HeapFigures{Live: 200 * mib}, 100)
	// Almost nothing live: the runtime's 4 MiB minimum heap, which scales
	// with GOGC, stays under the target.
	f(150*mib, HeapFigures{Live: 1}, 3750)
	// Nothing measured yet: the default.
	f(150*mib, HeapFigures{}, 100)
	// No target: the default.
	f(0, HeapFigures{Live: mib}, 100)
	// A large container: bounded.
	f(512*1024*mib, HeapFigures{Live: 20 * mib, Stacks: 4 * mib, Globals: mib}, maxGCPercent)
}

// TestGCPercentBounded: the largest memory limit the configuration accepts
// (memory::limit_mib up to 2^44 - 1) must not wrap GOGC, which the runtime
// keeps in an int32, negative (the GC off) or past any sane value.
func TestGCPercentBounded(t *testing.T) {
	const maxLimit = (1<<44 - 1) << 20
	for _, h := range []HeapFigures{{Live: 1}, {Live: mib}, {Live: 20 * mib, Stacks: 4 * mib, Globals: mib}} {
		for _, target := range []float64{0.5 * maxLimit, 0.99 * maxLimit, math.MaxFloat64, math.Inf(1)} {
			got := GCPercentFor(target, h)
			assert.GreaterOrEqual(t, got, defaultGCPercent, "target %g, %+v", target, h)
			assert.LessOrEqual(t, got, maxGCPercent, "target %g, %+v", target, h)
		}
	}

	rt := &fakeGCPercent{percent: 100}
	p := AcquireGCPercent(0.99, rt.options(nil))
	defer p.Release()
	require.Equal(t, Owned, p.Status())
	percent, changed := p.Update(maxLimit, maxLimit/2, 0, HeapFigures{Live: 1})
	assert.True(t, changed)
	assert.Equal(t, maxGCPercent, percent)
	require.NotEmpty(t, rt.calls)
	for _, v := range rt.calls {
		assert.Positive(t, int32(v), "GOGC %d as the runtime keeps it", v)
	}
}

func TestGCPercentOwnership(t *testing.T) {
	t.Run("owned: follows what is live, given back", func(t *testing.T) {
		rt := &fakeGCPercent{percent: 100}
		p := AcquireGCPercent(0.5, rt.options(nil))
		defer p.Release()
		require.Equal(t, Owned, p.Status())

		percent, changed := p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 20 * mib, Stacks: 4 * mib, Globals: mib})
		assert.True(t, changed)
		assert.Equal(t, 520, percent)
		assert.Equal(t, 520, rt.percent)

		// Small moves of what is live leave the GC percent alone.
		_, changed = p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 21 * mib, Stacks: 4 * mib, Globals: mib})
		assert.False(t, changed)
		assert.Equal(t, []int{520}, rt.calls)

		// What the working set holds besides the heap comes off the target:
		// 40 MiB of it leaves 110 MiB, (110 - 20) / 25 = 360 %.
		percent, changed = p.Update(300*mib, 240*mib, 100*mib, HeapFigures{Live: 20 * mib, Stacks: 4 * mib, Globals: mib, Objects: 50 * mib, Free: 10 * mib})
		assert.True(t, changed)
		assert.Equal(t, 360, percent)
		// A small container: 100 MiB, 30 MiB besides the heap leave 20 MiB
		// for a heap with 10 MiB live, less than GOGC's default wants.
		percent, _ = p.Update(100*mib, 80*mib, 45*mib, HeapFigures{Live: 10 * mib, Stacks: 2 * mib, Objects: 12 * mib, Free: 3 * mib})
		assert.Equal(t, 100, percent)
		p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 20 * mib, Stacks: 4 * mib, Globals: mib})

		// What is live grows: the GC percent falls to the default, which is set
		// even though it is a small step.
		percent, changed = p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 80 * mib, Stacks: 4 * mib, Globals: mib})
		assert.True(t, changed)
		assert.Equal(t, 100, percent)

		// No soft memory limit in force: only the GC percent would bound the heap.
		p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 20 * mib})
		require.NotEqual(t, 100, rt.percent)
		percent, _ = p.Update(300*mib, math.MaxInt64, 0, HeapFigures{Live: 20 * mib})
		assert.Equal(t, 100, percent)
		assert.Equal(t, 100, rt.percent)
		// No container limit either.
		p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 20 * mib})
		percent, _ = p.Update(0, 240*mib, 0, HeapFigures{Live: 20 * mib})
		assert.Equal(t, 100, percent)

		p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 20 * mib})
		require.NotEqual(t, 100, rt.percent)
		p.Release()
		assert.Equal(t, 100, rt.percent, "given back")
		n := len(rt.calls)
		_, changed = p.Update(300*mib, 240*mib, 0, HeapFigures{Live: mib})
		assert.False(t, changed)
		assert.Len(t, rt.calls, n, "no change after Release")
		p.Release()
		assert.Len(t, rt.calls, n, "Release is idempotent")
	})

	t.Run("nothing to give back when never raised", func(t *testing.T) {
		rt := &fakeGCPercent{percent: 100}
		p := AcquireGCPercent(0.5, rt.options(nil))
		p.Update(300*mib, 240*mib, 0, HeapFigures{Live: 200 * mib})
		p.Release()
		assert.Empty(t, rt.calls)
	})

	notOwned := func(t *testing.T, p *GCPercent, rt *fakeGCPercent, want Status) {
		t.Helper()
		defer p.Release()
		assert.Equal(t, want, p.Status())
		assert.False(t, p.Owned())
		_, changed := p.Update(300*mib, 240*mib, 0, HeapFigures{Live: mib})
		assert.False(t, changed)
		p.Release()
		assert.Empty(t, rt.calls, "never touched")
	}
	t.Run("turned off", func(t *testing.T) {
		rt := &fakeGCPercent{percent: 100}
		notOwned(t, AcquireGCPercent(0, rt.options(nil)), rt, Disabled)
	})
	t.Run("GOGC set by the user", func(t *testing.T) {
		rt := &fakeGCPercent{percent: 100}
		notOwned(t, AcquireGCPercent(0.5, rt.options(map[string]string{"GOGC": "100"})), rt, Environment)
	})
	t.Run("GC percent set in the process", func(t *testing.T) {
		rt := &fakeGCPercent{percent: 50}
		notOwned(t, AcquireGCPercent(0.5, rt.options(nil)), rt, AlreadySet)
	})
	t.Run("one owner per process", func(t *testing.T) {
		rt := &fakeGCPercent{percent: 100}
		first := AcquireGCPercent(0.5, rt.options(nil))
		require.Equal(t, Owned, first.Status())
		other := &fakeGCPercent{percent: 100}
		notOwned(t, AcquireGCPercent(0.5, other.options(nil)), other, OtherOwner)
		first.Release()
		again := AcquireGCPercent(0.5, rt.options(nil))
		assert.Equal(t, Owned, again.Status(), "free again once released")
		again.Release()
	})
}

// TestHeapViewCountsTheDefaultGCPercent raises the real GC percent with a
// soft limit binding: counted at the raised GC percent, the whole gap to its
// goal would read as held back and push the memory level to the hard line;
// a GC percent the throttle owns counts at GOGC's default, where nothing is
// held back.
func TestHeapViewCountsTheDefaultGCPercent(t *testing.T) {
	if v := debug.SetMemoryLimit(-1); v != math.MaxInt64 {
		t.Skipf("the test process already has a soft memory limit (%d)", v)
	}
	if g := runtimeGCPercent(); g != 100 {
		t.Skipf("the test process runs at GOGC=%d", g)
	}
	for range 32 {
		sink = append(sink, make([]byte, mib))
	}
	defer func() { sink = nil }()
	prevLimit := debug.SetMemoryLimit(96 * mib)
	defer debug.SetMemoryLimit(prevLimit)

	p := AcquireGCPercent(0.5, GCPercentOptions{Getenv: env(nil)})
	require.Equal(t, Owned, p.Status())
	defer p.Release()
	percent, changed := p.Update(1024*mib, 96*mib, 0, HeapFigures{Live: 32 * mib})
	require.True(t, changed)
	require.Greater(t, percent, 1000)
	require.Equal(t, percent, runtimeGCPercent())

	runtime.GC()
	_, held := NewHeapView(p).Read()
	assert.Less(t, held, uint64(8*mib), "32 MiB live wants 64 MiB at GOGC=100: under the limit")
	_, heldRaised := NewHeapView(nil).Read()
	assert.Greater(t, heldRaised, uint64(200*mib), "at the raised GC percent the goal would be far over the limit")

	p.Release()
	assert.Equal(t, 100, runtimeGCPercent(), "given back")
}
