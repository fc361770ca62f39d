// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package testutil // import "github.com/otelthrottle/throttle/internal/testutil"

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The collector's default log sampling (service telemetry logs.sampling in
// otelconftelemetry's default config): per 10s tick, the first 10 entries of
// a message, then 1 in 100.
const (
	collectorSamplingTick       = 10 * time.Second
	collectorSamplingInitial    = 10
	collectorSamplingThereafter = 100
)

// SampledLogger wraps an observer core the way the collector wraps its core
// (its default sampling) and counts what the sampler drops.
func SampledLogger(opts ...zap.Option) (*zap.Logger, *observer.ObservedLogs, *atomic.Int64) {
	core, logs := observer.New(zapcore.InfoLevel)
	var dropped atomic.Int64
	sampled := zapcore.NewSamplerWithOptions(core, collectorSamplingTick, collectorSamplingInitial, collectorSamplingThereafter,
		zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
			if d&zapcore.LogDropped != 0 {
				dropped.Add(1)
			}
		}))
	return zap.New(sampled, opts...), logs, &dropped
}

// TransitionMessage is the line the throttle logs for one state change of
// one signal (the runner's transition log): the log lines are part of the
// extension's behaviour, so they are spelled out here rather than taken from
// the code under test.
func TransitionMessage(signal, from, to fmt.Stringer) string {
	return "throttle " + signal.String() + ": " + from.String() + " -> " + to.String()
}

// Transitions adds up, per signal, the state changes a log shows: each
// individual line, and the counts of the summary lines. Last is the state
// the log last reports for the signal.
type Transitions[S comparable] struct {
	Lines, Summarised map[S]int
	Last              map[S]string
}

// CountTransitions reads the transition lines (TransitionMessage, with
// signal, from and to fields) and the summary lines (message summary, a
// field per signal with its changes and state) of entries. A line whose
// signal or state is not among signals and states, or whose message does
// not match its fields, fails the test.
func CountTransitions[S interface {
	comparable
	fmt.Stringer
}, T fmt.Stringer](tb testing.TB, entries []observer.LoggedEntry, summary string, signals []S, states []T) Transitions[S] {
	tb.Helper()
	a := Transitions[S]{Lines: map[S]int{}, Summarised: map[S]int{}, Last: map[S]string{}}
	signal := func(name any) S {
		i := slices.IndexFunc(signals, func(s S) bool { return s.String() == name })
		require.GreaterOrEqual(tb, i, 0, "unknown signal %v", name)
		return signals[i]
	}
	state := func(name any) T {
		i := slices.IndexFunc(states, func(s T) bool { return s.String() == name })
		require.GreaterOrEqual(tb, i, 0, "unknown state %v", name)
		return states[i]
	}
	for _, en := range entries {
		f := en.ContextMap()
		switch {
		case en.Message == summary:
			for _, s := range signals {
				v, ok := f[s.String()]
				if !ok {
					continue
				}
				m := v.(map[string]any)
				a.Summarised[s] += m["changes"].(int)
				a.Last[s] = m["state"].(string)
			}
		case f["from"] != nil:
			s := signal(f["signal"])
			require.Equal(tb, TransitionMessage(s, state(f["from"]), state(f["to"])), en.Message)
			a.Lines[s]++
			a.Last[s] = f["to"].(string)
		}
	}
	return a
}
