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
// second, so the client should come back soon.
const BudgetRetryDelay = time.Second

// DefaultRetryFloor and DefaultRetryCeiling are retry_after's defaults. The
// longest hint stays well inside the shortest common client budget, the
// SDKs' 10 s for a whole export with its retries: a client told to wait
// longer than it has left drops the batch instead of waiting. 0 is no
// floor worth having: some clients retry at once on it. The collector's
// exporters wait max(back-off, hint), so a short hint costs them nothing
// (docs/clients.md has what each client does).
const (
	DefaultRetryFloor   = time.Second
	DefaultRetryCeiling = 5 * time.Second
)

// shedRetryDelay is the longest hint of a shed refusal (clamped to the
// range): Shedding is a share of the load turned away, not a state to wait
// out; a client that comes back soon finds the same odds.
const shedRetryDelay = 2 * time.Second

// RetryDelay chooses the retry delay announced with a rejection, in whole
// seconds within [min, max], from why the request was refused: a budget
// refusal asks for BudgetRetryDelay, a shed one for a short uniform draw,
// an Open one for an estimate of the Open's remaining time, which is taken
// to be as long again as it has lasted (half to all of that, drawn, so
// that refused clients do not retry in lockstep). It is safe for
// concurrent use if its functions are.
type RetryDelay struct {
	minS, maxS int64
	budgetS    int64
	shedS      int64
	openFor    func() time.Duration
	randN      func(n int64) int64
}

// NewRetryDelay returns the delay chooser for the range [minDelay,
// maxDelay]. Bounds are turned into whole seconds (min rounded up, max
// rounded down; negative values count as 0; if max ends up below min the
// range is min alone). openFor tells how long the current Open has lasted
// (nil: Open hints are drawn from the whole range). randN(n) must return a
// uniform value in [0, n); nil means math/rand/v2.Int64N, which is safe for
// concurrent use and does not allocate.
func NewRetryDelay(minDelay, maxDelay time.Duration, openFor func() time.Duration, randN func(n int64) int64) *RetryDelay {
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
	clampS := func(d time.Duration) int64 { return min(max(int64(d/time.Second), minS), maxS) }
	return &RetryDelay{
		minS:    minS,
		maxS:    maxS,
		budgetS: clampS(BudgetRetryDelay),
		shedS:   clampS(shedRetryDelay),
		openFor: openFor,
		randN:   randN,
	}
}

// seconds returns the range in whole seconds.
func (d *RetryDelay) seconds() (minS, maxS int64) { return d.minS, d.maxS }

// Draw returns the delay to announce for verdict v: BudgetRetryDelay for
// DenyBudget, a draw up to shedRetryDelay for DenyShed, for DenyOpen a draw
// between half and all of how long the Open has lasted (the whole range
// without openFor), always within the range; 0 for Admit.
func (d *RetryDelay) Draw(v decision.Verdict) time.Duration {
	lo, hi := d.minS, d.maxS
	switch v {
	case decision.VerdictAdmit:
		return 0
	case decision.VerdictDenyBudget:
		return time.Duration(d.budgetS) * time.Second
	case decision.VerdictDenyShed:
		hi = d.shedS
	case decision.VerdictDenyOpen:
		if d.openFor != nil {
			est := int64((d.openFor() + time.Second - 1) / time.Second)
			hi = min(max(est, d.minS), d.maxS)
			lo = max((hi+1)/2, d.minS)
		}
	}
	s := lo
	if hi > lo {
		s += d.randN(hi - lo + 1)
	}
	return time.Duration(s) * time.Second
}
