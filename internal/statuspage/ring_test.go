// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func sampleAt(i int) Sample {
	return Sample{
		At:      t0.Add(time.Duration(i) * 250 * time.Millisecond),
		Levels:  [sampler.MaxResources]SampleLevel{{Value: float32(i), Valid: true}},
		States:  [decision.NumSignals]decision.State{decision.State(i % 3)},
		Allowed: uint64(i * 10), Denied: uint64(i),
	}
}

func indexes(s []Sample) []int {
	out := make([]int, len(s))
	for i := range s {
		out[i] = int(s[i].Levels[0].Value)
	}
	return out
}

// all returns every sample After(since) gives, checking that nothing was
// left out.
func all(t *testing.T, r *Ring, since time.Time) []Sample {
	t.Helper()
	s, more := r.After(since, r.Cap())
	assert.False(t, more)
	return s
}

func TestRingEmpty(t *testing.T) {
	r := NewRing(4)
	assert.Equal(t, 4, r.Cap())
	assert.Equal(t, 0, r.Len())
	assert.Empty(t, all(t, r, time.Time{}))
	assert.Equal(t, 1, NewRing(0).Cap(), "capacity is at least 1")
}

func TestRingWrapsOldestFirst(t *testing.T) {
	r := NewRing(5)
	for i := range 3 {
		r.Record(sampleAt(i))
	}
	assert.Equal(t, []int{0, 1, 2}, indexes(all(t, r, time.Time{})))
	assert.Equal(t, 3, r.Len())

	for i := 3; i < 12; i++ {
		r.Record(sampleAt(i))
	}
	assert.Equal(t, 5, r.Len())
	got := all(t, r, time.Time{})
	assert.Equal(t, []int{7, 8, 9, 10, 11}, indexes(got))
	assert.Equal(t, sampleAt(7), got[0], "samples are stored whole")
	assert.Equal(t, sampleAt(11), got[4])
}

func TestRingSince(t *testing.T) {
	r := NewRing(8)
	for i := range 20 {
		r.Record(sampleAt(i))
	}
	// Held: 12..19.
	assert.Equal(t, []int{16, 17, 18, 19}, indexes(all(t, r, sampleAt(15).At)), "strictly after since")
	assert.Equal(t, []int{16, 17, 18, 19}, indexes(all(t, r, sampleAt(15).At.Add(time.Millisecond))))
	assert.Empty(t, all(t, r, sampleAt(19).At))
	assert.Empty(t, all(t, r, sampleAt(25).At))
	assert.Equal(t, []int{12, 13, 14, 15, 16, 17, 18, 19}, indexes(all(t, r, sampleAt(2).At)),
		"a cursor older than the ring returns everything held")
}

func TestRingAfterLimitAndLast(t *testing.T) {
	r := NewRing(8)
	for i := range 20 {
		r.Record(sampleAt(i))
	}
	// Held: 12..19.
	got, more := r.After(time.Time{}, 3)
	assert.Equal(t, []int{12, 13, 14}, indexes(got), "the oldest first")
	assert.True(t, more)
	got, more = r.After(sampleAt(14).At, 3)
	assert.Equal(t, []int{15, 16, 17}, indexes(got))
	assert.True(t, more)
	got, more = r.After(sampleAt(16).At, 3)
	assert.Equal(t, []int{17, 18, 19}, indexes(got))
	assert.False(t, more, "exactly the rest")
	got, more = r.After(sampleAt(19).At, 3)
	assert.Empty(t, got)
	assert.False(t, more)
	got, more = r.After(time.Time{}, 0)
	assert.Empty(t, got)
	assert.True(t, more)

	assert.Equal(t, []int{17, 18, 19}, indexes(r.Last(3)), "the newest, oldest first")
	assert.Equal(t, []int{12, 13, 14, 15, 16, 17, 18, 19}, indexes(r.Last(100)))
	assert.Empty(t, r.Last(0))
	assert.Empty(t, NewRing(4).Last(3))
}

func TestRingCopies(t *testing.T) {
	r := NewRing(2)
	r.Record(sampleAt(1))
	s := all(t, r, time.Time{})
	s[0].Levels[0].Value = 99
	l := r.Last(1)
	l[0].Levels[0].Value = 98
	assert.Equal(t, []int{1}, indexes(all(t, r, time.Time{})))
}

func TestNewRingFor(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		capacity int
		minGap   time.Duration
	}{
		{250 * time.Millisecond, 2400, 0},
		{time.Second, 600, 0},
		{125 * time.Millisecond, 4800, 0},
		{10 * time.Millisecond, MaxCapacity, 125 * time.Millisecond},
		{time.Hour, 16, 0},
		{0, 2400, 0},
	} {
		r := NewRingFor(tc.interval)
		assert.Equal(t, tc.capacity, r.Cap(), "interval %v", tc.interval)
		assert.Equal(t, tc.minGap, r.MinGap(), "interval %v", tc.interval)
	}
}

func TestRingThinsFastSamplers(t *testing.T) {
	r := NewRingFor(10 * time.Millisecond)
	// One minute at 10 ms: 6000 samples, one kept every 125 ms.
	for i := range 6000 {
		r.Record(Sample{At: t0.Add(time.Duration(i) * 10 * time.Millisecond), Allowed: uint64(i)})
	}
	got := all(t, r, time.Time{})
	require.Len(t, got, 480)
	for i := 1; i < len(got); i++ {
		gap := got[i].At.Sub(got[i-1].At)
		require.True(t, gap >= 120*time.Millisecond && gap <= 130*time.Millisecond, "gap %v", gap)
	}
	// Cumulative counters survive thinning: a kept total includes the
	// counts of the dropped samples before it.
	last := got[len(got)-1]
	assert.GreaterOrEqual(t, last.Allowed, uint64(5875))
	assert.Equal(t, uint64(last.At.Sub(t0)/(10*time.Millisecond)), last.Allowed)
}

func TestRingRecordDoesNotAllocate(t *testing.T) {
	r := NewRingFor(250 * time.Millisecond)
	s := sampleAt(1)
	allocs := testing.AllocsPerRun(10000, func() {
		s.At = s.At.Add(250 * time.Millisecond)
		r.Record(s)
	})
	assert.Zero(t, allocs)
}

func TestRingConcurrent(t *testing.T) {
	r := NewRing(64)
	const writes = 5000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range writes {
			r.Record(sampleAt(i))
		}
	}()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				got := all(t, r, time.Time{})
				// Every snapshot is a consistent, ordered, gap-free window.
				for i := 1; i < len(got); i++ {
					if int(got[i].Levels[0].Value) != int(got[i-1].Levels[0].Value)+1 {
						t.Errorf("snapshot out of order: %v", indexes(got))
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, []int{writes - 2, writes - 1}, indexes(all(t, r, sampleAt(writes-3).At)))
}

func BenchmarkRingRecord(b *testing.B) {
	r := NewRingFor(250 * time.Millisecond)
	s := sampleAt(1)
	b.ReportAllocs()
	for b.Loop() {
		s.At = s.At.Add(250 * time.Millisecond)
		r.Record(s)
	}
}

func BenchmarkRingSnapshotFull(b *testing.B) {
	r := NewRingFor(250 * time.Millisecond)
	for i := range r.Cap() {
		r.Record(sampleAt(i))
	}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = r.After(time.Time{}, r.Cap())
	}
}
