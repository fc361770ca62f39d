// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// Signal is a telemetry signal with its own state machine.
type Signal = decision.Signal

// The signals.
const (
	SignalTraces   = decision.Traces
	SignalMetrics  = decision.Metrics
	SignalLogs     = decision.Logs
	SignalProfiles = decision.Profiles
)

// State is a signal's state: Normal, Shedding or Open.
type State = decision.State

// The states.
const (
	StateNormal   = decision.Normal
	StateShedding = decision.Shedding
	StateOpen     = decision.Open
)

// Verdict is the outcome of one admission decision.
type Verdict = decision.Verdict

// The verdicts.
const (
	Admit      = decision.Admit
	DenyShed   = decision.DenyShed
	DenyOpen   = decision.DenyOpen
	DenyBudget = decision.DenyBudget
)

// Throttle is what other components of the process (the throttle processor)
// use of a started throttle extension. Find it with
// host.GetExtensions()[id].(throttleextension.Throttle).
type Throttle interface {
	// Decide is the admission decision for one request or batch of signal:
	// one atomic load and at most one random draw.
	Decide(Signal) Verdict
	// RetryDelay draws the delay a rejected client is asked to wait
	// (retry_after range; short for DenyBudget).
	RetryDelay(Verdict) time.Duration
	// State is the current state of signal's state machine.
	State(Signal) State
	// RecordProcessorDecision counts a decision taken by a processor in the
	// extension's throttle_requests metric (protocol=processor).
	RecordProcessorDecision(Signal, Verdict)
	// ObserveOnly reports whether decisions are only counted (observe_only):
	// a refused batch then goes on.
	ObserveOnly() bool
}

// resourceSource is where the sampler reads CPU and memory usage: the cgroup
// reader or the process fallback in production. Tests inject their own
// (factoryOptions.source, or testseam from outside the package).
type resourceSource = sampler.Source

// factoryOptions are the factory's test seams.
type factoryOptions struct {
	source resourceSource
	// memoryLimit stands in for the runtime's soft memory limit (tests
	// only); nil: debug.SetMemoryLimit, and only with the default source.
	memoryLimit func(int64) int64
	// limitsEvery is how often limits are re-read (tests only); 0: the
	// sampler's default.
	limitsEvery time.Duration
}
