// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package testutil // import "github.com/otelthrottle/throttle/internal/testutil"

import (
	"sync"
	"time"
)

// Clock is a manual clock: it moves only when the test advances it. It is
// also a zapcore.Clock, so that a logger's sampler and the code under test
// can see the same time; its tickers are real ones. Safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock that reads start until advanced.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// NewTicker is time.NewTicker: only Now is manual.
func (*Clock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }
