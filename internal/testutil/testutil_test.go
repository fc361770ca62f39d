// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package testutil

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componentstatus"

	"github.com/otelthrottle/throttle/internal/cgroup"
)

// TestSourceFaults: what the tests that inject faults rely on.
func TestSourceFaults(t *testing.T) {
	boom := errors.New("boom")
	limits := cgroup.Limits{QuotaCores: 2, MemLimit: 1000}
	src := NewSource(limits)
	src.SetMemoryShare(0.95)

	src.FailNext(WorkingSet, 2, boom)
	for range 2 {
		_, err := src.WorkingSet()
		require.ErrorIs(t, err, boom)
	}
	ws, err := src.WorkingSet()
	require.NoError(t, err, "only the next two reads fail")
	assert.Equal(t, uint64(950), ws)
	assert.Equal(t, 3, src.Reads(WorkingSet))

	src.Fail(Limits, boom)
	for range 3 {
		l, err := src.Limits()
		require.ErrorIs(t, err, boom)
		assert.Equal(t, limits, l, "the limits it holds come with the error, as cgroup.Reader's")
	}
	src.Fail(Limits, nil)
	_, err = src.Limits()
	require.NoError(t, err)

	src.SetCPUTime(time.Hour)
	src.SetCPUStep(-time.Millisecond)
	first, err := src.CPUTime()
	require.NoError(t, err)
	second, err := src.CPUTime()
	require.NoError(t, err)
	assert.Equal(t, time.Hour-2*time.Millisecond, second)
	assert.Less(t, second, first, "a counter going backwards")
}

func TestSourceBlockCPUTime(t *testing.T) {
	src := NewSource(cgroup.Limits{})
	src.SetCPUTime(time.Second)
	done := make(chan time.Duration)
	go func() {
		for {
			d, _ := src.CPUTime()
			select {
			case done <- d:
				return
			default:
			}
		}
	}()
	release := src.BlockCPUTime(t)
	assert.True(t, src.ReadingCPUTime(), "a read waits")
	select {
	case <-done:
		t.Fatal("a blocked read returned")
	case <-time.After(20 * time.Millisecond):
	}
	release()
	release() // idempotent
	assert.Equal(t, time.Second, <-done)
	assert.False(t, src.ReadingCPUTime())
}

func TestClock(t *testing.T) {
	start := time.Unix(1_000_000, 0)
	c := NewClock(start)
	assert.Equal(t, start, c.Now())
	c.Advance(1500 * time.Millisecond)
	assert.Equal(t, start.Add(1500*time.Millisecond), c.Now())
}

func TestStatusHost(t *testing.T) {
	h := NewStatusHost()
	assert.Nil(t, h.GetExtensions())
	ok := componentstatus.NewEvent(componentstatus.StatusOK)
	failed := componentstatus.NewRecoverableErrorEvent(errors.New("boom"))
	h.Report(ok)
	h.Report(failed)
	assert.Same(t, ok, h.Next(t))
	assert.Same(t, failed, h.Next(t))
	assert.Equal(t, []*componentstatus.Event{ok, failed}, h.Recorded())
}
