// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCapacityOf: the capacity is the sink's rate over the step's second
// half, and a restart of the gateway during the step is seen (its memory
// limited it, so the rate is not its capacity).
func TestCapacityOf(t *testing.T) {
	// A warmup second, then a 10 s step: 1,000 spans/s for 5 s, 3,000
	// spans/s after; cumulative restarts from the timeline.
	timeline := func(restartAt float64) []point {
		var pts []point
		total, restarts := 0.0, 0
		for i := range 13 {
			tt := float64(i)
			phase := "warmup"
			if tt >= 1 {
				phase = "load"
			}
			switch {
			case tt > 6:
				total += 3000
			case tt > 1:
				total += 1000
			}
			if restartAt >= 0 && tt >= restartAt {
				restarts = 1
			}
			cpu := 90.0
			if i%2 == 0 {
				cpu = math.NaN() // a missed sample counts for nothing
			}
			pts = append(pts, point{t: tt, phase: phase, sinkTotal: total, restarts: restarts, cpuPct: cpu})
		}
		return pts
	}
	f := func(restartAt float64, wantRestarts int) {
		t.Helper()
		st, err := capacityOf(timeline(restartAt), 10*time.Second)
		require.NoError(t, err)
		assert.InDelta(t, 3000, st.spansPerSec, 1)
		assert.InDelta(t, 90, st.cpuPct, 0.01)
		assert.Equal(t, wantRestarts, st.restarts)
	}
	f(-1, 0)
	f(4, 1)
	f(12, 0) // after the step: not the step's

	_, err := capacityOf(timeline(-1)[:8], 10*time.Second)
	require.Error(t, err, "a timeline that ends before the step does")
}
