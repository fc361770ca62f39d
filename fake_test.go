// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor

import (
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// fakeThrottle is the small interface the processor consumes
// (throttleapi.Throttle), with verdicts the test sets. It records every
// decision the processor reports.
type fakeThrottle struct {
	component.StartFunc
	component.ShutdownFunc

	delay   time.Duration
	decides [decision.NumSignals]atomic.Int64

	mu       sync.Mutex
	verdicts [decision.NumSignals]decision.Verdict
	recorded []recorded
}

// recorded is one processor decision reported to a fakeThrottle.
type recorded struct {
	Signal  decision.Signal
	Verdict decision.Verdict
}

var _ throttleapi.Throttle = (*fakeThrottle)(nil)

// newFakeThrottle returns a fakeThrottle that admits everything and whose
// RetryDelay is delay.
func newFakeThrottle(delay time.Duration) *fakeThrottle { return &fakeThrottle{delay: delay} }

// set makes v the verdict, and the state it implies, of signal s.
func (f *fakeThrottle) set(s decision.Signal, v decision.Verdict) {
	f.mu.Lock()
	f.verdicts[s] = v
	f.mu.Unlock()
}

// recordedDecisions returns the processor decisions reported so far, oldest
// first.
func (f *fakeThrottle) recordedDecisions() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.recorded...)
}

func (f *fakeThrottle) Decide(s decision.Signal) decision.Verdict {
	f.decides[s].Add(1)
	return f.verdict(s)
}

func (f *fakeThrottle) verdict(s decision.Signal) decision.Verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.verdicts[s]
}

func (f *fakeThrottle) RetryDelay(decision.Verdict) time.Duration { return f.delay }

// State is Open for a signal refused as in Open, Normal otherwise.
func (f *fakeThrottle) State(s decision.Signal) decision.State {
	if f.verdict(s) == decision.VerdictDenyOpen {
		return decision.StateOpen
	}
	return decision.StateNormal
}

func (*fakeThrottle) ObserveOnly() bool { return false }

func (f *fakeThrottle) RecordProcessorDecision(s decision.Signal, v decision.Verdict) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recorded = append(f.recorded, recorded{s, v})
}

// host is a component.Host holding the given extensions.
type host map[component.ID]component.Component

func (h host) GetExtensions() map[component.ID]component.Component { return h }

// hostWith returns a host holding ext under id.
func hostWith(id component.ID, ext component.Component) component.Host { return host{id: ext} }

// outcomePoints are the expected data points of the processor's counters
// for one signal: values by outcome ("passed", "refused", "dropped"); an
// outcome left out has no point.
func outcomePoints(sig decision.Signal, values map[string]int64) []metricdata.DataPoint[int64] {
	var dps []metricdata.DataPoint[int64]
	for _, o := range []string{"passed", "refused", "dropped"} {
		v, ok := values[o]
		if !ok {
			continue
		}
		dps = append(dps, metricdata.DataPoint[int64]{
			Attributes: attribute.NewSet(
				attribute.String("processor", "throttle"),
				attribute.String("signal", sig.String()),
				attribute.String("outcome", o),
			),
			Value: v,
		})
	}
	return dps
}
