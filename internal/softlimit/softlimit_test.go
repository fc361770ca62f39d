// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package softlimit

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeRuntime stands in for debug.SetMemoryLimit.
type fakeRuntime struct {
	limit int64
	calls int
}

func newFakeRuntime() *fakeRuntime { return &fakeRuntime{limit: math.MaxInt64} }

func (f *fakeRuntime) set(v int64) int64 {
	prev := f.limit
	if v >= 0 {
		f.limit = v
		f.calls++
	}
	return prev
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

const mib = 1 << 20

func TestOwnership(t *testing.T) {
	on := Config{Enabled: true, Share: 0.8}

	t.Run("owned: share of the limit, followed, given back", func(t *testing.T) {
		rt := newFakeRuntime()
		o := Acquire(on, Options{SetMemoryLimit: rt.set, Getenv: env(nil)})
		defer o.Release()
		require.Equal(t, Owned, o.Status())
		limit, changed := o.Update(150 * mib)
		assert.True(t, changed)
		assert.Equal(t, int64(120*mib), limit)
		assert.Equal(t, int64(120*mib), rt.limit)

		// Every sample calls Update: the same limit changes nothing.
		_, changed = o.Update(150 * mib)
		assert.False(t, changed)
		assert.Equal(t, 1, rt.calls)

		// An in-place pod resize: the soft limit follows.
		limit, changed = o.Update(300 * mib)
		assert.True(t, changed)
		assert.Equal(t, int64(240*mib), limit)
		assert.Equal(t, int64(240*mib), rt.limit)

		// The memory limit is gone: no soft limit either.
		_, changed = o.Update(0)
		assert.True(t, changed)
		assert.Equal(t, int64(math.MaxInt64), rt.limit)

		_, _ = o.Update(150 * mib)
		o.Release()
		assert.Equal(t, int64(math.MaxInt64), rt.limit, "Release restores the limit found at Acquire")
		_, changed = o.Update(300 * mib)
		assert.False(t, changed, "no Update after Release")
		assert.Equal(t, int64(math.MaxInt64), rt.limit)
	})

	t.Run("GOMEMLIMIT in the environment is respected", func(t *testing.T) {
		rt := newFakeRuntime()
		rt.limit = 100 * mib // the runtime applied it at start
		o := Acquire(on, Options{SetMemoryLimit: rt.set, Getenv: env(map[string]string{"GOMEMLIMIT": "100MiB"})})
		defer o.Release()
		assert.Equal(t, Environment, o.Status())
		limit, changed := o.Update(150 * mib)
		assert.False(t, changed)
		assert.Equal(t, int64(100*mib), limit)
		o.Release()
		assert.Equal(t, int64(100*mib), rt.limit)
		assert.Zero(t, rt.calls)
	})

	t.Run("a limit set by someone else is respected", func(t *testing.T) {
		rt := newFakeRuntime()
		rt.limit = 90 * mib
		o := Acquire(on, Options{SetMemoryLimit: rt.set, Getenv: env(nil)})
		defer o.Release()
		assert.Equal(t, AlreadySet, o.Status())
		o.Update(150 * mib)
		assert.Equal(t, int64(90*mib), rt.limit)
	})

	t.Run("turned off", func(t *testing.T) {
		rt := newFakeRuntime()
		o := Acquire(Config{Enabled: false, Share: 0.8}, Options{SetMemoryLimit: rt.set, Getenv: env(nil)})
		defer o.Release()
		assert.Equal(t, Disabled, o.Status())
		o.Update(150 * mib)
		assert.Zero(t, rt.calls)
		assert.Equal(t, int64(math.MaxInt64), rt.limit)
	})

	t.Run("one owner per process", func(t *testing.T) {
		rt := newFakeRuntime()
		first := Acquire(on, Options{SetMemoryLimit: rt.set, Getenv: env(nil)})
		second := Acquire(on, Options{SetMemoryLimit: rt.set, Getenv: env(nil)})
		assert.Equal(t, Owned, first.Status())
		assert.Equal(t, OtherOwner, second.Status())
		second.Release()
		first.Update(150 * mib)
		assert.Equal(t, int64(120*mib), rt.limit)
		first.Release()
		third := Acquire(on, Options{SetMemoryLimit: rt.set, Getenv: env(nil)})
		defer third.Release()
		assert.Equal(t, Owned, third.Status(), "released ownership can be taken again")
	})

	t.Run("nil release", func(*testing.T) {
		var o *Owner
		o.Release()
	})
}

// TestOwnershipRealRuntime sets the process's own soft limit and gives it
// back.
func TestOwnershipRealRuntime(t *testing.T) {
	if v := debug.SetMemoryLimit(-1); v != math.MaxInt64 {
		t.Skipf("the test process already has a soft memory limit (%d): GOMEMLIMIT set?", v)
	}
	o := Acquire(Config{Enabled: true, Share: 0.5}, Options{Getenv: env(nil)})
	defer o.Release()
	require.Equal(t, Owned, o.Status())
	o.Update(8 << 30)
	assert.Equal(t, int64(4<<30), debug.SetMemoryLimit(-1))
	assert.Equal(t, int64(4<<30), o.Limit())
	o.Release()
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1))
}

func TestHeldBackArithmetic(t *testing.T) {
	f := func(live, goal, gogc, stacks, globals, want uint64) {
		t.Helper()
		assert.Equal(t, want, heldBackBytes(live, goal, gogc, stacks, globals), "live %d goal %d gogc %d", live, goal, gogc)
	}
	// No soft limit binding: the goal is the GC's own.
	f(100, 220, 100, 10, 10, 0)
	f(100, 300, 100, 0, 0, 0)
	// A soft limit holds the goal under the GC percent: the gap is held back.
	f(100, 150, 100, 0, 0, 50)
	f(100, 150, 100, 20, 30, 100)
	f(100, 120, 50, 0, 0, 30)
	// GOGC=off reads as a huge percentage: counted as 100.
	f(100, 150, math.MaxUint64, 0, 0, 50)
	// Before the first collection nothing is live.
	f(0, 4<<20, 100, 0, 0, 0)
}

func TestSpareArithmetic(t *testing.T) {
	f := func(free, goal, objects, want uint64) {
		t.Helper()
		assert.Equal(t, want, spareBytes(free, goal, objects), "free %d goal %d objects %d", free, goal, objects)
	}
	// Just after a collection: the heap grows back to its goal first.
	f(300, 700, 400, 0)
	f(300, 700, 500, 100)
	// A heap that shrank (a drained pipeline): most of what it freed is spare.
	f(600, 200, 100, 500)
	// At or past the goal (the GC is marking): all of it is spare.
	f(50, 700, 700, 50)
	f(50, 700, 800, 50)
	// Nothing free.
	f(0, 700, 100, 0)
}

var sink [][]byte

// TestHeapViewSeesALimitSqueezing holds live data close to a soft limit:
// the GC's goal is then held under twice the live heap, and HeldBack says
// by how much.
func TestHeapViewSeesALimitSqueezing(t *testing.T) {
	if v := debug.SetMemoryLimit(-1); v != math.MaxInt64 {
		t.Skipf("the test process already has a soft memory limit (%d)", v)
	}
	v := NewHeapView(nil)
	runtime.GC()
	_, held := v.Read()
	assert.Zero(t, held, "no soft limit: nothing held back")

	for range 64 {
		sink = append(sink, make([]byte, mib))
	}
	defer func() { sink = nil }()
	prev := debug.SetMemoryLimit(96 * mib)
	defer debug.SetMemoryLimit(prev)
	runtime.GC()
	_, held = v.Read()
	// 64 MiB live wants a 128 MiB heap at GOGC=100; the limit allows less
	// than 96 MiB.
	assert.Greater(t, held, uint64(30*mib))
	assert.Less(t, held, uint64(80*mib))
}

// TestHeapViewSpare frees a large live set: the heap keeps the memory for
// reuse, far more than it grows back into before its next collection, and
// Read reports it as spare rather than leaving it in the level.
func TestHeapViewSpare(t *testing.T) {
	v := NewHeapView(nil)
	debug.FreeOSMemory() // start with nothing kept from earlier tests
	for range 64 {
		sink = append(sink, make([]byte, mib))
	}
	runtime.GC()
	before, _ := v.Read()
	sink = nil
	runtime.GC()
	after, _ := v.Read()
	// The background scavenger may have returned some of it already.
	assert.Greater(t, after, before+16*mib, "64 MiB freed: spare before %d, after %d", before, after)
}

func TestRelief(t *testing.T) {
	var gcs int
	now := time.Unix(1000, 0)
	r := NewRelief()
	r.gc = func() { gcs++; runtime.GC() }
	r.now = func() time.Time { return now }
	frame := func() bool {
		now = now.Add(250 * time.Millisecond)
		return r.Relieve()
	}

	runtime.GC() // the collector collects by itself
	assert.False(t, frame(), "a collection ran since the last call: nothing to do")
	assert.True(t, frame(), "none for a frame: collect, so that the heap figures are renewed")
	for range 3 {
		assert.False(t, frame(), "only the relief's own since, but within a second of it")
	}
	assert.True(t, frame(), "a second after its own: collect again")
	runtime.GC()
	assert.False(t, frame())
	for range 4 {
		runtime.GC() // a busy collector, a second after the relief's last collection
		assert.False(t, frame(), "it collects by itself")
	}
	assert.True(t, frame(), "quiet for a frame, and the relief's last collection is over a second old")
	assert.Equal(t, 3, gcs)
}
