// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"math/rand/v2"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// BudgetRetryDelay is the retry delay suggested for a DenyBudget rejection
// (clamped to the configured range). A full budget is a burst, not a state:
// it clears as soon as the requests in flight finish, typically within a
// second, so the client should come back soon rather than after a long
// random delay meant to spread a sustained overload.
const BudgetRetryDelay = time.Second

// DefaultRetryMax is retry_after.max's default: wide enough to spread the
// retries of many rejected clients, no longer than the OTLP exporters' own
// longest back-off.
const DefaultRetryMax = 30 * time.Second

// RetryDelay draws the retry delay announced with a rejection: whole seconds,
// uniformly distributed in [min, max] so that rejected clients do not retry
// in lockstep. It is safe for concurrent use if its rand function is.
type RetryDelay struct {
	minS, maxS int64
	budgetS    int64
	randN      func(n int64) int64
}

// NewRetryDelay returns a drawer for the range [minDelay, maxDelay]. Bounds
// are turned into whole seconds (min rounded up, max rounded down; negative
// values count as 0; if max ends up below min the range is min alone).
// randN(n) must return a uniform value in [0, n); nil means
// math/rand/v2.Int64N, which is safe for concurrent use and does not
// allocate.
func NewRetryDelay(minDelay, maxDelay time.Duration, randN func(n int64) int64) *RetryDelay {
	minS := int64(0)
	if minDelay > 0 {
		minS = int64((minDelay + time.Second - 1) / time.Second)
	}
	maxS := int64(0)
	if maxDelay > 0 {
		maxS = int64(maxDelay / time.Second)
	}
	maxS = max(maxS, minS)
	if randN == nil {
		randN = rand.Int64N
	}
	return &RetryDelay{
		minS:    minS,
		maxS:    maxS,
		budgetS: min(max(int64(BudgetRetryDelay/time.Second), minS), maxS),
		randN:   randN,
	}
}

// seconds returns the range in whole seconds.
func (d *RetryDelay) seconds() (minS, maxS int64) { return d.minS, d.maxS }

// Draw returns the delay to announce for verdict v: BudgetRetryDelay
// (clamped to the range) for DenyBudget, a uniform draw for the other
// denials, 0 for Admit.
func (d *RetryDelay) Draw(v decision.Verdict) time.Duration {
	switch v {
	case decision.Admit:
		return 0
	case decision.DenyBudget:
		return time.Duration(d.budgetS) * time.Second
	}
	s := d.minS
	if d.maxS > d.minS {
		s += d.randN(d.maxS - d.minS + 1)
	}
	return time.Duration(s) * time.Second
}
