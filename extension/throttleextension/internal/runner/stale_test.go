// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestStaleCounterCountsOnlyTicksOnTime: a sampler that publishes nothing
// while the watchdog runs on time is stuck; a process so starved of CPU
// that its watchdog runs late too is not called stuck, however long the
// gap, and every publication starts the count again.
func TestStaleCounterCountsOnlyTicksOnTime(t *testing.T) {
	const interval = 250 * time.Millisecond
	start := time.Unix(1000, 0)
	published := start

	c := staleCounter{interval: interval, need: 4}
	at := start
	for i := range 3 {
		at = at.Add(interval)
		assert.False(t, c.tick(at, published), "on-time tick %d of 4", i+1)
	}
	// Starved: the watchdog runs seconds late, again and again.
	for range 10 {
		at = at.Add(3 * time.Second)
		assert.False(t, c.tick(at, published), "late ticks do not count")
	}
	at = at.Add(interval)
	assert.True(t, c.tick(at, published), "the 4th on-time tick without a publication")

	// A publication starts the count again.
	published = at
	for i := range 3 {
		at = at.Add(interval)
		assert.False(t, c.tick(at, published), "tick %d after a publication", i+1)
	}
	at = at.Add(interval)
	assert.True(t, c.tick(at, published))
}
