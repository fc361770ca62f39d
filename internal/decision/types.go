// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package decision holds the per-signal state machines of the throttle and
// the admission decision made on the request path.
//
// It is free of collector types: the extension feeds it water levels from the
// sampler and asks it for decisions.
package decision // import "github.com/otelthrottle/throttle/internal/decision"

// Signal is a telemetry signal with its own state machine.
type Signal uint8

// The signals, in a fixed order usable as array indexes.
const (
	SignalTraces Signal = iota
	SignalMetrics
	SignalLogs
	SignalProfiles
	// NumSignals is the number of signals; not a signal.
	NumSignals
)

var signalNames = [NumSignals]string{"traces", "metrics", "logs", "profiles"}

// String returns the signal's name as used in config and telemetry.
func (s Signal) String() string {
	if s < NumSignals {
		return signalNames[s]
	}
	return "unknown"
}

// ParseSignal returns the signal named name ("traces", "metrics", "logs",
// "profiles").
func ParseSignal(name string) (Signal, bool) {
	for i, n := range signalNames {
		if n == name {
			return Signal(i), true
		}
	}
	return 0, false
}

// State is the state of one signal's state machine.
type State uint8

// The states. Their numeric values are those of the state gauge.
const (
	StateNormal   State = 0
	StateShedding State = 1
	StateOpen     State = 2
)

var stateNames = [...]string{"normal", "shedding", "open"}

// String returns the state's lower-case name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// Verdict is the outcome of one admission decision.
type Verdict uint8

// The verdicts.
const (
	// VerdictAdmit lets the request in.
	VerdictAdmit Verdict = iota
	// VerdictDenyShed rejects it: the signal is Shedding (or ramping up after Open)
	// and the random draw fell under the drop probability.
	VerdictDenyShed
	// VerdictDenyOpen rejects it: the signal is Open.
	VerdictDenyOpen
	// VerdictDenyBudget rejects it: the admission budget of in-flight bytes is full.
	// Decide never returns it; the middleware does.
	VerdictDenyBudget
	// NumVerdicts is the number of verdicts; not a verdict.
	NumVerdicts
)

var verdictReasons = [NumVerdicts]string{"", "shed", "open", "budget"}

// Admitted reports whether v lets the request in.
func (v Verdict) Admitted() bool { return v == VerdictAdmit }

// Reason is the telemetry reason of a denial ("shed", "open", "budget"), or
// "" for Admit.
func (v Verdict) Reason() string {
	if v < NumVerdicts {
		return verdictReasons[v]
	}
	return "unknown"
}
