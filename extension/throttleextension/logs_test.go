// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// What the runner's transition log promises
// (internal/runner/transitionlog.go), spelled out here: the log lines are
// part of the extension's behaviour.
const (
	transitionLogWindow      = 10 * time.Second
	transitionLinesPerWindow = 5
	transitionSummaryMessage = "throttle: state changes not logged individually (more than 5 of a signal in 10s); counts per signal and the state now"
)

func TestLogTransitionsAndStartup(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	set := nopSettings()
	set.Logger = zap.New(core)
	src := newFakeSource(50)
	src.SetLimits(cgroup.Limits{QuotaCores: 2, MemLimit: testMemLimit})
	e := startTestExtension(t, src, testConfig(t), set)

	started := logs.FilterMessage("throttle started").All()
	require.Len(t, started, 1)
	f := started[0].ContextMap()
	assert.Equal(t, "fake source (test)", f["resource_source"])
	assert.Equal(t, 2.0, f["effective_cores"])
	assert.Equal(t, uint64(testMemLimit), f["memory_limit_bytes"])
	assert.Equal(t, zapcore.InfoLevel, started[0].Level)

	waitValid(t, src)
	src.SetMemoryShare(0.95)
	waitState(t, e, decision.StateOpen)
	src.SetMemoryShare(0.5)
	waitState(t, e, decision.StateNormal)
	// The engine publishes a state before it reports the change, so the
	// line may still be being written: stop the sampler to have them all.
	require.NoError(t, e.Shutdown(context.Background()))

	for _, s := range allSignals {
		open := logs.FilterMessage(testutil.TransitionMessage(s, decision.StateNormal, decision.StateOpen)).All()
		require.Len(t, open, 1, s.String())
		f := open[0].ContextMap()
		assert.Equal(t, zapcore.InfoLevel, open[0].Level)
		assert.Equal(t, s.String(), f["signal"])
		assert.Equal(t, "normal", f["from"])
		assert.Equal(t, "open", f["to"])
		assert.Equal(t, 0.95, f["memory"])
		assert.Equal(t, true, f["memory_valid"])
		assert.Equal(t, 0.0, f["cpu_fast"])
		assert.Equal(t, 0.0, f["cpu_slow"])

		back := logs.FilterMessage(testutil.TransitionMessage(s, decision.StateOpen, decision.StateNormal)).All()
		require.Len(t, back, 1, s.String())
		assert.Equal(t, 0.5, back[0].ContextMap()["memory"])
	}
	assert.Equal(t, 8, logs.FilterMessageSnippet("throttle ").FilterFieldKey("from").Len(), "one line per change per signal")
	assert.Zero(t, logs.FilterMessage(transitionSummaryMessage).Len(), "nothing to summarise")
}

// TestTransitionsSurviveLogSampling flaps the state 40 times (80 changes
// per signal, well within 10s) under the collector's default sampling: the
// sampler must drop nothing, and the log must account for every change,
// individually or in the summary, and end on the current state.
func TestTransitionsSurviveLogSampling(t *testing.T) {
	logger, logs, dropped := testutil.SampledLogger()
	set := nopSettings()
	set.Logger = logger
	src := newFakeSource(50)
	e := startTestExtension(t, src, testConfig(t), set)
	waitValid(t, src)

	const cycles = 40
	start := time.Now()
	for range cycles {
		src.SetMemoryShare(0.95)
		waitState(t, e, decision.StateOpen)
		src.SetMemoryShare(0.5)
		waitState(t, e, decision.StateNormal)
	}
	// Shutdown writes the summary of the window still open.
	require.NoError(t, e.Shutdown(context.Background()))

	assert.Zero(t, dropped.Load(), "the collector's sampler dropped state-change lines")
	a := testutil.CountTransitions(t, logs.All(), transitionSummaryMessage, allSignals, allStates)
	for _, s := range allSignals {
		assert.Equal(t, 2*cycles, a.Lines[s]+a.Summarised[s], "%s: every change is in the log", s)
		assert.LessOrEqual(t, a.Lines[s], 2*cycles)
		assert.Positive(t, a.Lines[s], s.String())
		assert.Equal(t, "normal", a.Last[s], "%s: the log ends on the current state", s)
	}
	// Bounded volume: per 10s window at most 5 lines per signal and one
	// summary (normally the whole run is one window).
	windows := 1 + int(time.Since(start)/transitionLogWindow)
	assert.LessOrEqual(t, logs.FilterMessage(transitionSummaryMessage).Len(), windows)
	for _, s := range allSignals {
		assert.LessOrEqual(t, a.Lines[s], windows*transitionLinesPerWindow, s.String())
	}
}

// TestMemoryLimitAboveTheContainer: a memory::limit_mib above the
// container's limit gives way to it, and a Warn names the field; one under
// it binds, quietly.
func TestMemoryLimitAboveTheContainer(t *testing.T) {
	for _, tc := range []struct {
		limitMiB  uint64
		wantLimit uint64
		wantWarns int
	}{
		{limitMiB: 2 * testMemLimit >> 20, wantLimit: testMemLimit, wantWarns: 1},
		{limitMiB: testMemLimit >> 21, wantLimit: testMemLimit / 2, wantWarns: 0},
	} {
		core, logs := observer.New(zapcore.InfoLevel)
		set := nopSettings()
		set.Logger = zap.New(core)
		startTestExtension(t, newFakeSource(10), testConfig(t, func(c *Config) { c.Memory.LimitMiB = tc.limitMiB }), set)

		started := logs.FilterMessage("throttle started").All()
		require.Len(t, started, 1)
		assert.Equal(t, tc.wantLimit, started[0].ContextMap()["memory_limit_bytes"], "limit_mib %d", tc.limitMiB)
		warns := logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("memory::limit_mib").All()
		require.Len(t, warns, tc.wantWarns, "limit_mib %d", tc.limitMiB)
		if tc.wantWarns > 0 {
			assert.Equal(t, tc.limitMiB, warns[0].ContextMap()["memory_limit_mib"])
		}
	}
}
