// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package throttleapi is what the other components of this repository use
// of the throttle extension in the same process: the throttle processor
// finds it through Throttle. It is not part of the extension's public API,
// which is NewFactory and the configuration.
package throttleapi // import "github.com/otelthrottle/throttle/internal/throttleapi"

import (
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// Throttle is what the throttle processor uses of a started throttle
// extension. Find it with host.GetExtensions()[id].(throttleapi.Throttle).
type Throttle interface {
	// Decide is the admission decision for one request or batch of signal:
	// one atomic load and at most one random draw.
	Decide(decision.Signal) decision.Verdict
	// RetryDelay draws the delay a rejected client is asked to wait
	// (retry_after range; short for DenyBudget).
	RetryDelay(decision.Verdict) time.Duration
	// State is the current state of signal's state machine.
	State(decision.Signal) decision.State
	// RecordProcessorDecision counts a decision taken by a processor in the
	// extension's throttle_requests metric (protocol=processor).
	RecordProcessorDecision(decision.Signal, decision.Verdict)
	// ObserveOnly reports whether decisions are only counted (observe_only):
	// a refused batch then goes on.
	ObserveOnly() bool
}
