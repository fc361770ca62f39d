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
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
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
func newTestExtension(tb testing.TB, src sampler.Source, cfg *Config, set extension.Settings) *throttleExtension {
	var fo factoryOptions
	if src != nil {
		fo.source = src
	}
	ext, err := newFactory(fo).Create(context.Background(), set, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, ext.Shutdown(context.Background())) })
	return ext.(*throttleExtension)
}

func startTestExtension(tb testing.TB, src sampler.Source, cfg *Config, set extension.Settings) *throttleExtension {
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

// waitTicks waits for n more checks of the sampler reading src (one
// working set read a check). Checks run one after the other, so once n >= 2
// more have begun, one that read src as it is now has completed.
func waitTicks(tb testing.TB, src *testutil.Source, n int) {
	tb.Helper()
	target := src.Reads(testutil.WorkingSet) + n
	require.Eventually(tb, func() bool { return src.Reads(testutil.WorkingSet) >= target }, 30*time.Second, time.Millisecond)
}

// waitValid waits until the engine has acted on src as it is now, with a
// valid CPU window (from the second check on).
func waitValid(tb testing.TB, src *testutil.Source) {
	tb.Helper()
	waitTicks(tb, src, 2)
}

// waterLevels are the kinds of throttle_water_level tel holds and their
// values: a level that is not valid is not reported.
func waterLevels(tb testing.TB, tel *componenttest.Telemetry) map[string]float64 {
	tb.Helper()
	out := map[string]float64{}
	m, err := tel.GetMetric("otelcol_throttle_water_level")
	if err != nil {
		return out
	}
	for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
		k, _ := dp.Attributes.Value("kind")
		out[k.AsString()] = dp.Value
	}
	return out
}

// waitLevel waits until tel reports a valid CPU level and the memory level
// mem.
func waitLevel(tb testing.TB, tel *componenttest.Telemetry, mem float64) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		l := waterLevels(tb, tel)
		_, cpu := l["cpu"]
		got, ok := l["memory"]
		return cpu && ok && got == mem
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
		src := newFakeSource(50)
		e := newTestExtension(t, src, testConfig(t), nopSettings())
		require.NoError(t, e.Start(ctx, host))
		assert.Positive(t, src.Reads(testutil.WorkingSet), "Start takes the first sample")
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
		core, logs := observer.New(zapcore.InfoLevel)
		set := nopSettings()
		set.Logger = zap.New(core)
		e := newTestExtension(t, newFakeSource(50), testConfig(t), set)
		require.NoError(t, e.Start(ctx, host))
		require.NoError(t, e.Start(ctx, host))
		assert.Equal(t, 1, logs.FilterMessage("throttle started").Len(), "a second Start must not start a second sampler")
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
		assert.Equal(t, int64(admission.AutoInflightBudget().Resolve(0, cores)), fields["admission_budget_bytes"])
		assert.LessOrEqual(t, fields["admission_budget_bytes"], int64(32<<20), "at most the no-limit budget")
		require.NoError(t, e.Shutdown(ctx))
	})
}

// TestStateThroughSeam drives the memory level through the fake source and
// checks the states and decisions that follow.
func TestStateThroughSeam(t *testing.T) {
	src := newFakeSource(50)
	e := startTestExtension(t, src, testConfig(t), nopSettings())
	waitValid(t, src)
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
	waitValid(t, src)
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
		require.Equal(t, decision.VerdictAdmit, e.Decide(decision.SignalMetrics), "the processor does not ramp an exempt signal")
	}
	assert.Greater(t, shed, 90, "right after Open the ramp must shed nearly everything")
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

// TestShutdownClosesOwnedSource checks that the source the extension reads
// this process's resources from (its cgroup, or its own counters) is closed
// at Shutdown, and an injected one is left to its owner.
func TestShutdownClosesOwnedSource(t *testing.T) {
	src := &closeCountingSource{Source: newFakeSource(50)}
	e := startTestExtension(t, src, testConfig(t), nopSettings())
	require.NoError(t, e.Shutdown(context.Background()))
	assert.Zero(t, src.closed.Load(), "an injected source belongs to the caller")

	own := &closeCountingSource{Source: newFakeSource(50)}
	ext, err := newFactory(factoryOptions{processSource: own}).Create(context.Background(), nopSettings(),
		testConfig(t, func(c *Config) { c.Memory.SoftLimit.Enabled, c.Memory.SoftLimit.HeapTarget = false, 0 }))
	require.NoError(t, err)
	require.NoError(t, ext.Start(context.Background(), componenttest.NewNopHost()))
	require.NoError(t, ext.Shutdown(context.Background()))
	assert.EqualValues(t, 1, own.closed.Load(), "this process's source is closed with the extension")
	require.NoError(t, ext.Shutdown(context.Background()))
	assert.EqualValues(t, 1, own.closed.Load(), "and only once")
}

type closeCountingSource struct {
	*testutil.Source
	closed atomic.Int64
}

func (c *closeCountingSource) Close() error {
	c.closed.Add(1)
	return nil
}
