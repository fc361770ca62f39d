// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

// The demand signal: the load offered to the collector against
// what it can take, for an autoscaler. The throttle holds CPU near its
// enter line and memory under its lines by refusing and holding work, so
// utilisation alone understates what was turned away:
//
//	demand = level × (admitted + refused) / admitted × (1 + held / in flight)
//
// level is the largest slow level of the resources that measure the
// collector's own capacity (1 = the container's limit; not the exporters'
// queues: more replicas do not make a backend faster); the refusal factor
// is over the last demandWindow, without the refusals the backend caused
// (open-loop clients that are refused send more than is admitted); the hold
// factor is how much longer than needed the clients wait (closed-loop
// clients, whose fixed number of requests wait in the hold: by Little's
// law, held / in flight is the time they wait over the time they are
// served). It is smoothed over demandSmoothing and at most demandMax.
const (
	demandWindow    = 10 * time.Second
	demandSmoothing = 5 * time.Second
	demandMax       = 10
)

// demandMeter computes the demand signal on the sampler goroutine and
// publishes it for the gauge.
type demandMeter struct {
	// totals of admitted and refused decisions at each sample of the last
	// demandWindow, oldest first.
	marks []demandMark
	value atomic.Uint64 // float64 bits
	init  bool
	// lastRefused is the refusal total of the last sample, and
	// backendRefused the refusals of the samples in which the backend was
	// the bound: taken out of the window's refusals, so that they count
	// neither while the queue is full nor once it has drained.
	lastRefused, backendRefused uint64
}

type demandMark struct {
	at                time.Time
	admitted, refused uint64
}

// decisionTotals sums the counts: what was admitted and what was refused
// (or would have been, in observe_only) over every protocol and signal.
func decisionTotals(c *decisionCounts) (admitted, refused uint64) {
	for p := range admission.NumProtocols {
		for s := range decision.NumSignals {
			for v := range decision.NumVerdicts {
				n := c.loadProtocol(p, s, v)
				if v == decision.VerdictAdmit {
					admitted += n
				} else {
					refused += n
				}
			}
		}
	}
	return admitted, refused
}

// observe takes one sample: the capacity level, whether the backend is
// the bound (see demandLevel), the decision totals so far, the admitted
// requests in flight and the held ones.
func (d *demandMeter) observe(at time.Time, level float64, backendBound bool, admitted, refused uint64, inflight, held int64) {
	if backendBound && d.init && refused >= d.lastRefused {
		d.backendRefused += refused - d.lastRefused
	}
	d.lastRefused = refused
	counted := refused - min(d.backendRefused, refused)
	d.marks = append(d.marks, demandMark{at: at, admitted: admitted, refused: counted})
	for len(d.marks) > 1 && at.Sub(d.marks[0].at) > demandWindow {
		d.marks = d.marks[1:]
	}
	first := d.marks[0]
	da, dr := admitted-first.admitted, counted-first.refused
	refusal := 1.0
	if da+dr > 0 {
		refusal = float64(da+dr) / float64(max(da, 1))
	}
	hold := 1 + float64(max(held, 0))/float64(max(inflight, 1))
	if backendBound {
		// Held for the backend: no demand more replicas would serve.
		hold = 1
	}
	raw := min(level*refusal*hold, demandMax)
	v := raw
	if d.init && len(d.marks) > 1 {
		dt := at.Sub(d.marks[len(d.marks)-2].at)
		beta := math.Exp(-dt.Seconds() / demandSmoothing.Seconds())
		v = beta*math.Float64frombits(d.value.Load()) + (1-beta)*raw
	}
	d.init = true
	d.value.Store(math.Float64bits(v))
}

// load is the last demand published; 0 before the first sample.
func (d *demandMeter) load() float64 { return math.Float64frombits(d.value.Load()) }
