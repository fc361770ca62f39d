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

// ResourceSource is where the sampler reads CPU and memory usage: the cgroup
// reader or the process fallback in production. Tests inject their own with
// WithResourceSource to drive the water level.
type ResourceSource = sampler.Source

// Option customises the factory.
type Option func(*factoryOptions)

type factoryOptions struct {
	source ResourceSource
	// memoryLimit stands in for the runtime's soft memory limit (tests
	// only); nil: debug.SetMemoryLimit, and only with the default source.
	memoryLimit func(int64) int64
	// limitsEvery is how often limits are re-read (tests only); 0: the
	// sampler's default.
	limitsEvery time.Duration
}

// WithResourceSource makes every extension created by the factory read its
// resources from src instead of the cgroup or process counters. It is the
// seam tests use to drive the throttle's state through the real sampler and
// state machines.
func WithResourceSource(src ResourceSource) Option {
	return func(o *factoryOptions) { o.source = src }
}
