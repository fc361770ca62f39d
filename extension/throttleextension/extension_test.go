// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// testMemLimit is the memory limit the fake source reports.
const testMemLimit = 100 << 20

// newFakeSource is a source at pct percent of testMemLimit that uses no CPU,
// so the CPU level is 0 once valid and only memory drives the state; memory
// breaches in one check (testConfig), so one tick makes a change.
func newFakeSource(pct uint64) *testutil.Source {
	src := testutil.NewSource(cgroup.Limits{MemLimit: testMemLimit})
	src.SetMemoryShare(float64(pct) / 100)
	return src
}

// testConfig is the default configuration with a 10ms interval, no recovery
// ramp, metrics exempt (rules.metrics.enabled: false) and no stale-level
// fallback (so a slow machine cannot turn a state back to Normal).
func testConfig(tb testing.TB, mutate ...func(*Config)) *Config {
	cfg := createDefaultConfig().(*Config)
	cfg.CheckInterval = 10 * time.Millisecond
	// Three checks for the CPU and one for memory, as the engine's own
	// tests: at the shipped 750ms and 250ms every flap would take a second.
	cfg.CPU.BreachDuration = 3 * cfg.CheckInterval
	cfg.Memory.BreachDuration = cfg.CheckInterval
	cfg.RecoveryRamp = 0
	cfg.StaleAfter = 0
	cfg.Rules["metrics"] = decision.RuleConfig{Enabled: ptrTo(false)}
	cfg.Hold.MaxWait = 0 // refusals answered at once unless a test turns holding on
	for _, m := range mutate {
		m(cfg)
	}
	require.NoError(tb, confmap.Validate(cfg))
	return cfg
}

// newTestExtension creates (but does not start) an extension through the
// factory, with src injected when not nil. Shutdown runs at cleanup.
func newTestExtension(tb testing.TB, src resourceSource, cfg *Config, set extension.Settings) *throttleExtension {
	var fo factoryOptions
	if src != nil {
		fo.source = src
	}
	ext, err := newFactory(fo).Create(context.Background(), set, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, ext.Shutdown(context.Background())) })
	return ext.(*throttleExtension)
}

func startTestExtension(tb testing.TB, src resourceSource, cfg *Config, set extension.Settings) *throttleExtension {
	e := newTestExtension(tb, src, cfg, set)
	require.NoError(tb, e.Start(context.Background(), componenttest.NewNopHost()))
	return e
}

func nopSettings() extension.Settings { return extensiontest.NewNopSettings(metadata.Type) }

// waitState waits until every signal is in want.
func waitState(tb testing.TB, e *throttleExtension, want decision.State) {
	require.Eventually(tb, func() bool {
		for s := range decision.NumSignals {
			if e.State(s) != want {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "state never became %v", want)
}

// waitValid waits until the published level has a valid CPU window (the
// second tick) and the given memory level.
func waitValid(tb testing.TB, e *throttleExtension, mem float64) {
	require.Eventually(tb, func() bool {
		wl := e.runner.Level()
		return wl != nil && wl.CPUValid && wl.MemValid && wl.Mem == mem
	}, 10*time.Second, time.Millisecond)
}

var (
	allSignals = []decision.Signal{decision.SignalTraces, decision.SignalMetrics, decision.SignalLogs, decision.SignalProfiles}
	allStates  = []decision.State{decision.StateNormal, decision.StateShedding, decision.StateOpen}
)

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	host := componenttest.NewNopHost()

	t.Run("start_shutdown", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		e := newTestExtension(t, newFakeSource(50), testConfig(t), nopSettings())
		require.NoError(t, e.Start(ctx, host))
		require.NotNil(t, e.runner.Sampler())
		require.NoError(t, e.Shutdown(ctx))
	})
	t.Run("shutdown_without_start", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		e := newTestExtension(t, newFakeSource(50), testConfig(t), nopSettings())
		require.NoError(t, e.Shutdown(ctx))
		require.NoError(t, e.Shutdown(ctx))
	})
	t.Run("double_start_double_shutdown", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		e := newTestExtension(t, newFakeSource(50), testConfig(t), nopSettings())
		require.NoError(t, e.Start(ctx, host))
		first := e.runner.Sampler()
		require.NoError(t, e.Start(ctx, host))
		assert.Same(t, first, e.runner.Sampler(), "a second Start must not create a second sampler")
		require.NoError(t, e.Shutdown(ctx))
		require.NoError(t, e.Shutdown(ctx))
	})
	t.Run("start_after_shutdown_does_not_restart", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		src := newFakeSource(50)
		e := newTestExtension(t, src, testConfig(t), nopSettings())
		require.NoError(t, e.Start(ctx, host))
		require.NoError(t, e.Shutdown(ctx))
		calls := src.Reads(testutil.WorkingSet)
		ignore := goleak.IgnoreCurrent()
		require.NoError(t, e.Start(ctx, host))
		goleak.VerifyNone(t, ignore)
		assert.Equal(t, calls, src.Reads(testutil.WorkingSet), "Start after Shutdown must not sample")
		require.NoError(t, e.Shutdown(ctx))
	})
	t.Run("disabled_starts_no_sampler_and_admits", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		src := newFakeSource(100)
		e := newTestExtension(t, src, testConfig(t, func(c *Config) { c.Enabled = false }), nopSettings())
		ignore := goleak.IgnoreCurrent()
		require.NoError(t, e.Start(ctx, host))
		goleak.VerifyNone(t, ignore)
		assert.Nil(t, e.runner.Sampler())
		assert.Zero(t, src.Reads(testutil.WorkingSet), "a disabled throttle must not read resources")
		for _, s := range allSignals {
			assert.Equal(t, decision.VerdictAdmit, e.Decide(s), s.String())
			assert.True(t, e.runner.Exempt(s), s.String())
			assert.Equal(t, decision.StateNormal, e.State(s), s.String())
		}
		require.NoError(t, e.Shutdown(ctx))
	})
	t.Run("default_source_on_this_machine", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		core, logs := observer.New(zapcore.InfoLevel)
		set := nopSettings()
		set.Logger = zap.New(core)
		e := newTestExtension(t, nil, testConfig(t), set)
		require.NoError(t, e.Start(ctx, host))
		started := logs.FilterMessage("throttle started").All()
		require.Len(t, started, 1)
		src := started[0].ContextMap()["resource_source"].(string)
		assert.True(t, strings.HasPrefix(src, "cgroup v") || strings.HasPrefix(src, "process"), src)
		t.Logf("resource source on this machine: %s", src)
		require.NoError(t, e.Shutdown(ctx))
	})
	t.Run("process_fallback", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		core, logs := observer.New(zapcore.InfoLevel)
		set := nopSettings()
		set.Logger = zap.New(core)
		proc := cgroup.NewProcess("/")
		defer proc.Close()
		e := newTestExtension(t, proc, testConfig(t), set)
		require.NoError(t, e.Start(ctx, host))
		started := logs.FilterMessage("throttle started").All()
		require.Len(t, started, 1)
		fields := started[0].ContextMap()
		assert.Contains(t, fields["resource_source"], "process")
		// No limit from the process: the memory signal is off and "auto"
		// is sized by the cores alone (at most the fixed no-limit budget).
		assert.Equal(t, uint64(0), fields["memory_limit_bytes"])
		cores, ok := fields["effective_cores"].(float64)
		require.True(t, ok)
		assert.Equal(t, int64(autoInflightBudget().resolve(0, cores)), fields["admission_budget_bytes"])
		assert.LessOrEqual(t, fields["admission_budget_bytes"], int64(noLimitAutoBudget))
		require.NoError(t, e.Shutdown(ctx))
	})
}

// TestStateThroughSeam drives the memory level through the fake source and
// checks the states and decisions that follow.
func TestStateThroughSeam(t *testing.T) {
	src := newFakeSource(50)
	e := startTestExtension(t, src, testConfig(t), nopSettings())
	waitValid(t, e, 0.5)
	for _, s := range allSignals {
		require.Equal(t, decision.StateNormal, e.State(s))
		require.Equal(t, decision.VerdictAdmit, e.Decide(s))
	}

	// 95% is over mem hard (0.92): Open in one tick (one check breaches).
	src.SetMemoryShare(0.95)
	waitState(t, e, decision.StateOpen)
	for _, s := range allSignals {
		// rules.metrics.enabled: false, but memory is at its hard line:
		// the backstop refuses the exempt signal too.
		assert.Equal(t, decision.VerdictDenyOpen, e.Decide(s), s.String())
	}
	var exempt [decision.NumSignals]bool
	for s := range decision.NumSignals {
		exempt[s] = e.runner.Exempt(s)
	}
	assert.Equal(t, [decision.NumSignals]bool{false, true, false, false}, exempt)

	// Back to 50% with recovery_ramp 0: Normal and admitting at once.
	src.SetMemoryShare(0.5)
	waitState(t, e, decision.StateNormal)
	for _, s := range allSignals {
		assert.Equal(t, decision.VerdictAdmit, e.Decide(s), s.String())
	}

	// 87% lies between mem enter (0.85) and hard (0.92): Shedding with
	// p_drop = (0.87-0.85)/(0.92-0.85) under the default rule 0..1.
	src.SetMemoryShare(0.87)
	waitState(t, e, decision.StateShedding)
	wantP := (0.87 - 0.85) / (0.92 - 0.85)
	st := e.runner.Engine().Stat()
	assert.InDelta(t, wantP, st.Signals[decision.SignalTraces].DropProbability, 1e-9)
	assert.Zero(t, st.Signals[decision.SignalMetrics].DropProbability)
	const n = 4000
	denied := 0
	for range n {
		switch v := e.Decide(decision.SignalTraces); v {
		case decision.VerdictDenyShed:
			denied++
		case decision.VerdictAdmit:
		default:
			t.Fatalf("unexpected verdict %v in Shedding", v)
		}
		require.Equal(t, decision.VerdictAdmit, e.Decide(decision.SignalMetrics))
	}
	// Binomial(4000, 0.286): the standard deviation is 0.7%; allow 6.
	assert.InDelta(t, wantP, float64(denied)/n, 0.045, "denied %d of %d", denied, n)

	src.SetMemoryShare(0.5)
	waitState(t, e, decision.StateNormal)
}

// TestRecoveryRampAfterOpen checks that leaving Open does not admit at once
// when a ramp is configured.
func TestRecoveryRampAfterOpen(t *testing.T) {
	src := newFakeSource(50)
	// An hour-long ramp keeps p_drop within 1e-5 of 1 for the whole test.
	e := startTestExtension(t, src, testConfig(t, func(c *Config) { c.RecoveryRamp = time.Hour }), nopSettings())
	waitValid(t, e, 0.5)
	src.SetMemoryShare(0.95)
	waitState(t, e, decision.StateOpen)
	src.SetMemoryShare(0.5)
	waitState(t, e, decision.StateNormal)

	shed := 0
	for range 100 {
		v := e.Decide(decision.SignalTraces)
		require.NotEqual(t, decision.VerdictDenyOpen, v, "Normal must not deny as Open")
		if v == decision.VerdictDenyShed {
			shed++
		}
		require.Equal(t, decision.VerdictAdmit, e.Decide(decision.SignalMetrics), "an exempt signal is not ramped")
	}
	assert.Greater(t, shed, 90, "right after Open the ramp must shed nearly everything")
	assert.Greater(t, e.runner.Engine().Stat().Signals[decision.SignalTraces].DropProbability, 0.99)
}

func TestRetryDelay(t *testing.T) {
	e := newTestExtension(t, newFakeSource(50), testConfig(t, func(c *Config) {
		c.RetryAfter.Min = 2 * time.Second
		c.RetryAfter.Max = 3 * time.Second
	}), nopSettings())
	for range 50 {
		d := e.RetryDelay(decision.VerdictDenyOpen)
		assert.GreaterOrEqual(t, d, 2*time.Second)
		assert.LessOrEqual(t, d, 3*time.Second)
	}
}

// TestShutdownClosesOwnedSource checks that a source the extension created
// itself is closed, and an injected one is left to its owner.
func TestShutdownClosesOwnedSource(t *testing.T) {
	src := &closeCountingSource{Source: newFakeSource(50)}
	e := startTestExtension(t, src, testConfig(t), nopSettings())
	require.NoError(t, e.Shutdown(context.Background()))
	assert.Zero(t, src.closed.Load(), "an injected source belongs to the caller")

	e = newTestExtension(t, nil, testConfig(t), nopSettings())
	require.NoError(t, e.Start(context.Background(), componenttest.NewNopHost()))
	require.NotNil(t, e.runner.OwnedSource())
	require.NoError(t, e.Shutdown(context.Background()))
}

type closeCountingSource struct {
	*testutil.Source
	closed atomic.Int64
}

func (c *closeCountingSource) Close() error {
	c.closed.Add(1)
	return nil
}
