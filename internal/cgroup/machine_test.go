// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRealMachineReader reads this machine's own cgroup twice: the files
// kept open must give fresh content on every pread at offset 0.
func TestRealMachineReader(t *testing.T) {
	r, err := NewReader("/")
	if errors.Is(err, ErrNoCgroup) {
		t.Skipf("no cgroup here: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	t.Log(r.Describe())

	first, err := r.CPUTime()
	require.NoError(t, err)
	// Burn CPU until the cgroup's counter moves; it is cumulative, so it
	// must, unless the reads were served from a stale snapshot.
	for {
		now, err := r.CPUTime()
		require.NoError(t, err)
		if now > first {
			break
		}
	}
	if _, err := r.WorkingSet(); err != nil {
		require.ErrorIs(t, err, ErrNoMemory)
	}
	_, err = r.Limits()
	require.NoError(t, err)
}

// BenchmarkRealMachine reads this machine's cgroup files (kernfs, not a
// fixture on disk).
func BenchmarkRealMachine(b *testing.B) {
	r, err := NewReader("/")
	if err != nil {
		b.Skipf("no cgroup here: %v", err)
	}
	b.Cleanup(func() { _ = r.Close() })
	b.Run("CPUTime", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.CPUTime(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("WorkingSet", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.WorkingSet(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
