// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// The criteria a hostile peer is judged by: with one hostile peer at a
// time the normal clients keep at least minThroughput of their throughput
// without it, none of their refusals is a budget refusal lasting over
// maxBudgetStretch, and the hostile peer's requests are the ones refused.
const (
	minThroughput    = 0.95
	maxBudgetStretch = 2 * time.Second
	// refusalNoise is how much more of the normal clients' requests than
	// in their baseline round may be refused before the refusals count as
	// not falling on the hostile peer: baseline rounds with no hostile peer
	// at all refuse from none to a few percent of them, in bursts, and one
	// burst in a short round is over half a percent.
	refusalNoise = 0.01
)

// roundResult is what one round measured.
type roundResult struct {
	round    int
	scenario string
	// pair is the round of the baseline this round is compared with (0
	// for a baseline).
	pair int
	// window is the load phase: the normal clients' requests sent in it
	// count; the hostile peer runs through it.
	window        time.Duration
	offeredItemsS float64
	// acceptedItemsS is the normal clients' accepted items per second of
	// the window; baselineItemsS the pair's.
	acceptedItemsS, baselineItemsS float64
	// baselineRefused is the share of the normal clients' requests the
	// pair refused.
	baselineRefused float64
	// normal counts the normal clients' requests of the window by class
	// (skipped ones as errors); normalByProto the same per protocol.
	normal [numClasses]int
	// longestBudget is the longest stretch of the normal clients' budget
	// refusals (see longestBudgetStretch), on protocol budgetProto,
	// starting at budgetAt (since the window's start).
	longestBudget time.Duration
	budgetProto   string
	budgetAt      time.Duration
	// hostile counts the hostile peer's requests by class.
	hostile [numClasses]int
	// hostileKinds counts them per kind of request and class.
	hostileKinds map[string]*[numClasses]int
	// The gateway: its budget, its peak working set and limit, OOM kills
	// and restarts during the round.
	budget        int64
	peakWS, limit uint64
	oomKills      uint64
	restarts      int
	// buckets are the normal clients' answers per bucketLen of the window,
	// by class: the refusals over time.
	buckets [][numClasses]int

	// gateway describes the round's gateway; target is what the round is
	// judged by (a finding's one figure, or the criteria of check).
	gateway string
	target  targetKind
	// batch counts the honest batch client's requests of the window by
	// class, batchKind names them ("" without the client).
	batch     [numClasses]int
	batchKind string
	// shutdown: the round ended with a SIGTERM to the gateway, which took
	// exitAfter to exit, exitKilled: not within the grace (then killed).
	shutdown   bool
	exitAfter  time.Duration
	exitKilled bool
	// peakReserved is the largest reservation of the budget the gateway
	// reported in the window (its metrics, sampled), limit/autoBudgetDivisor
	// its memory limit's share the target compares it with.
	peakReserved int64
	// hostBusyPct is how busy the whole machine was in the window, in % of
	// all its cores: the gateway, the clients, the peer and whatever else
	// ran on it.
	hostBusyPct float64
}

// bucketLen is the resolution of the refusals over time in the report.
const bucketLen = 5 * time.Second

// analyse fills the normal clients', the honest batch client's and the
// hostile peer's figures of r from their answers, the window being
// [from, from+r.window) since the round's start.
func (r *roundResult) analyse(normal, batch, hostile []answer, from time.Duration) {
	to := from + r.window
	var in []answer
	for _, a := range normal {
		if a.sent >= from && a.sent < to {
			in = append(in, a)
		}
	}
	accepted := 0
	r.buckets = make([][numClasses]int, int((r.window+bucketLen-1)/bucketLen))
	for _, a := range in {
		r.normal[a.class]++
		accepted += a.items
		if b := int((a.sent - from) / bucketLen); b < len(r.buckets) {
			r.buckets[b][a.class]++
		}
	}
	r.acceptedItemsS = float64(accepted) / r.window.Seconds()
	r.longestBudget, r.budgetProto, r.budgetAt = longestBudgetStretch(in)
	if r.budgetProto != "" {
		r.budgetAt -= from
	}
	for _, a := range batch {
		if a.sent >= from && a.sent < to {
			r.batch[a.class]++
			r.batchKind = a.who
		}
	}
	r.hostileKinds = map[string]*[numClasses]int{}
	for _, a := range hostile {
		r.hostile[a.class]++
		k := r.hostileKinds[a.who]
		if k == nil {
			k = &[numClasses]int{}
			r.hostileKinds[a.who] = k
		}
		k[a.class]++
	}
}

// longestBudgetStretch returns the longest time, per protocol, from a
// budget refusal of the normal clients to the last budget refusal that
// followed it before any of their requests was accepted: how long the
// budget locked them out. Refusals of other reasons and errors in between
// neither end nor extend it; one lone budget refusal is a stretch of 0.
// Times are the requests' send times.
func longestBudgetStretch(answers []answer) (longest time.Duration, proto string, at time.Duration) {
	byProto := map[string][]answer{}
	for _, a := range answers {
		byProto[a.who] = append(byProto[a.who], a)
	}
	protos := make([]string, 0, len(byProto))
	for p := range byProto {
		protos = append(protos, p)
	}
	slices.Sort(protos)
	longest = -1
	for _, p := range protos {
		as := byProto[p]
		slices.SortStableFunc(as, func(a, b answer) int { return int(a.sent - b.sent) })
		in := false
		var first time.Duration
		for _, a := range as {
			switch a.class {
			case classOK:
				in = false
			case classBudget:
				if !in {
					in, first = true, a.sent
				}
				if d := a.sent - first; d > longest {
					longest, proto, at = d, p, first
				}
			default:
			}
		}
	}
	if longest < 0 {
		return 0, "", 0
	}
	return longest, proto, at
}

// answered is the number of normal requests that got an answer or an
// error (skipped ones included: they are load the clients could not send).
func (r *roundResult) answered() int {
	n := 0
	for c := range numClasses {
		n += r.normal[c]
	}
	return n
}

func refusals(c *[numClasses]int) int {
	return c[classBudget] + c[classShed] + c[classOpen] + c[classRefused]
}

func total(c *[numClasses]int) int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// throughputRatio is the normal clients' accepted items/s as a share of
// the pair baseline's; NaN-free: 0 when the baseline accepted nothing.
func (r *roundResult) throughputRatio() float64 {
	if r.baselineItemsS <= 0 {
		return 0
	}
	return r.acceptedItemsS / r.baselineItemsS
}

// refusedShares are the shares of the normal clients' and the hostile
// peer's requests that the gateway refused.
func (r *roundResult) refusedShares() (normal, hostile float64) {
	if n := r.answered(); n > 0 {
		normal = float64(refusals(&r.normal)) / float64(n)
	}
	if n := total(&r.hostile); n > 0 {
		hostile = float64(refusals(&r.hostile)) / float64(n)
	}
	return normal, hostile
}

// verdict is one round's criteria.
type verdict struct {
	throughput, budget, hostileRefused, noOOM bool
}

func (v verdict) pass() bool { return v.throughput && v.budget && v.hostileRefused && v.noOOM }

// check applies the benchmark's criteria: the normal clients keep
// minThroughput of the baseline's accepted items/s; their longest budget
// stretch is at most maxBudgetStretch; the refusals fall on the hostile
// peer (the normal clients were refused nothing, or a smaller share of
// their requests than the hostile peer, or at most refusalNoise more of
// them than in their baseline round); and the gateway was neither
// OOM-killed nor restarted.
func (r *roundResult) check() verdict {
	n, h := r.refusedShares()
	return verdict{
		throughput:     r.throughputRatio() >= minThroughput,
		budget:         r.longestBudget <= maxBudgetStretch,
		hostileRefused: refusals(&r.normal) == 0 || h > n || n <= r.baselineRefused+refusalNoise,
		noOOM:          r.oomKills == 0 && r.restarts == 0,
	}
}

// batchAccepted is the share of the honest batch client's requests of the
// window that were accepted (errors and timeouts count as not accepted);
// false without any.
func (r *roundResult) batchAccepted() (float64, bool) {
	n := total(&r.batch)
	if n == 0 {
		return 0, false
	}
	return float64(r.batch[classOK]) / float64(n), true
}

// reservedBound is the reservation the targetReserved target allows: the
// memory limit's share the auto budget is sized by.
func (r *roundResult) reservedBound() int64 {
	return int64(min(r.limit/autoBudgetDivisor, math.MaxInt64))
}

// targetResult returns the round's figure for its target, for the report,
// and whether it reached it; "" and false for targetCriteria (check has
// those).
func (r *roundResult) targetResult() (measured string, pass bool) {
	noOOM := r.oomKills == 0 && r.restarts == 0
	switch r.target {
	case targetNoOOM:
		return fmt.Sprintf("%d OOM kills, %d restarts", r.oomKills, r.restarts), noOOM
	case targetBatches:
		share, ok := r.batchAccepted()
		if !ok {
			return "no batch sent", false
		}
		return fmt.Sprintf("%d/%d accepted (%.1f %%)", r.batch[classOK], total(&r.batch), 100*share), share >= minBatchAccepted
	case targetShutdown:
		if !r.shutdown {
			return "no SIGTERM sent", false
		}
		if r.exitKilled {
			return fmt.Sprintf("not exited after %.1f s: killed", r.exitAfter.Seconds()), false
		}
		return fmt.Sprintf("exited %.1f s after SIGTERM", r.exitAfter.Seconds()), r.exitAfter <= maxShutdown
	case targetReserved:
		bound := r.reservedBound()
		m := fmt.Sprintf("peak reserved %.1f MiB (%.2f × limit/%d = %.1f MiB), %d OOM kills", float64(r.peakReserved)/(1<<20),
			float64(r.peakReserved)/float64(max(bound, 1)), autoBudgetDivisor, float64(bound)/(1<<20), r.oomKills)
		return m, bound > 0 && r.peakReserved <= bound && noOOM
	default:
		return "", false
	}
}

// passed is whether a scenario round reached its target: the criteria of
// check for targetCriteria.
func (r *roundResult) passed() bool {
	if r.target == targetCriteria {
		return r.check().pass()
	}
	_, ok := r.targetResult()
	return ok
}
