// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"context"
	"encoding/json"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/confignet"
	"go.opentelemetry.io/collector/config/configopaque"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/downstream"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/statuspage"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// testConfig is the runner's configuration for the extension's defaults,
// as far as the tests here use it: the default lines and rules, a 250ms
// interval, no stale watchdog, no soft memory limit, no status page,
// nothing reported.
func testConfig(mutate ...func(*Config)) Config {
	cfg := Config{
		Settings:   DefaultSettings(),
		CPU:        DefaultCPUConfig(),
		Memory:     DefaultMemoryConfig(),
		Downstream: downstream.DefaultConfig(),
		Rules:      decision.DefaultRulesConfig(),
		RetryAfter: middleware.NewDefaultRetryConfig(),
	}
	cfg.StaleAfter = 0
	cfg.Memory.SoftLimit.Enabled = false
	for _, m := range mutate {
		m(&cfg)
	}
	return cfg
}

// newTestRunner creates (but does not start) a runner; Shutdown runs at
// cleanup.
func newTestRunner(t *testing.T, cfg Config) *Runner {
	t.Helper()
	r, err := New(cfg, componenttest.NewNopTelemetrySettings(), component.MustNewID("throttle"), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Shutdown(context.Background())) })
	return r
}

// newStartedRunner creates a runner with set that reads this process's own
// counters and logs to the returned observer, calls each before on it, and
// starts it; Shutdown runs at cleanup.
func newStartedRunner(t *testing.T, set component.TelemetrySettings, cfg Config, before ...func(*Runner)) (*Runner, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	set.Logger = zap.New(core)
	r, err := New(cfg, set, component.MustNewID("throttle"), Options{Source: cgroup.NewProcess("/")})
	require.NoError(t, err)
	for _, f := range before {
		f(r)
	}
	require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, r.Shutdown(context.Background())) })
	return r, logs
}

func TestStatusPageOff(t *testing.T) {
	r := newTestRunner(t, testConfig())
	assert.Nil(t, r.status.ring)
	assert.Nil(t, r.status.server)
}

// The sampler goroutine records into the ring and checks for a status
// change on every sample: without a change it must not allocate.
func TestStatusRecordDoesNotAllocate(t *testing.T) {
	r := newTestRunner(t, testConfig(func(c *Config) {
		c.ReportStatus = true
		c.Status = &statuspage.Config{ServerConfig: confighttp.ServerConfig{NetAddr: confignet.AddrConfig{Endpoint: "127.0.0.1:0", Transport: confignet.TransportTypeTCP}}}
	}))
	wl := levels(&sampler.WaterLevel{Mem: 0.5, MemValid: true, At: time.Now()})
	allocs := testing.AllocsPerRun(100, func() {
		r.status.record(wl)
		r.Record(admission.ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit)
	})
	assert.Zero(t, allocs)
	assert.Positive(t, r.status.ring.Len())
	require.NoError(t, r.Shutdown(context.Background()))
}

// The stale fallback turns every signal Normal without a sample; whoever
// triggers it calls reportChange, which then reports OK: a throttle that
// admits everything must not keep the component in error.
func TestReportStatusStaleFallback(t *testing.T) {
	r := newTestRunner(t, testConfig(func(c *Config) { c.ReportStatus = true }))
	host := testutil.NewStatusHost()
	r.status.host = host // as Start does; the engine is driven by hand below

	r.engine.Observe(levels(&sampler.WaterLevel{Mem: 0.95, MemValid: true, At: time.Now()}))
	r.status.reportChange()
	require.Equal(t, componentstatus.StatusRecoverableError, host.Next(t).Status())
	r.status.reportChange() // no change, no report

	require.Eventually(t, func() bool { return r.engine.Expire(time.Nanosecond) }, 10*time.Second, time.Millisecond)
	live := r.status.live()
	assert.True(t, live.Stale)
	for _, s := range live.Signals {
		assert.Equal(t, decision.StateNormal, s.State)
		assert.Zero(t, s.DropProbability)
	}
	r.status.reportChange()
	require.Equal(t, componentstatus.StatusOK, host.Next(t).Status())

	// Once Shutdown has begun nothing is reported (the host is Stopping).
	r.engine.Observe(levels(&sampler.WaterLevel{Mem: 0.95, MemValid: true, At: time.Now()}))
	require.NoError(t, r.Shutdown(context.Background()))
	r.status.reportChange()
	assert.Len(t, host.Recorded(), 2)
}

// statusPageConfig turns the status page on (its server is not started
// unless the runner is).
func statusPageConfig(c *Config) {
	c.Status = &statuspage.Config{ServerConfig: confighttp.ServerConfig{NetAddr: confignet.AddrConfig{Endpoint: "127.0.0.1:0", Transport: confignet.TransportTypeTCP}}}
}

// The page lists the state changes, newest first, one entry per change of
// the shared state machine, with what in the frame caused it.
func TestStatusPageTransitions(t *testing.T) {
	r := newTestRunner(t, testConfig(statusPageConfig))
	assert.Empty(t, r.status.live().Transitions)
	t1 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	t2 := t1.Add(250 * time.Millisecond)
	r.engine.Observe(levels(&sampler.WaterLevel{At: t1, Mem: 0.95, MemValid: true}))
	r.engine.Observe(levels(&sampler.WaterLevel{At: t2, Mem: 0.5, MemValid: true}))

	all := [decision.NumSignals]bool{true, true, true, true}
	assert.Equal(t, []statuspage.Transition{
		{
			At: t2, Signals: all, From: decision.StateOpen, To: decision.StateNormal,
			Why: "cpu not measured, memory 50% < hard 92%; memory 50% < exit 78%",
		},
		{At: t1, Signals: all, From: decision.StateNormal, To: decision.StateOpen, Why: "memory 95% ≥ hard 92%"},
	}, r.status.live().Transitions)
}

// Without the page nothing is kept.
func TestStatusTransitionsWithoutPage(t *testing.T) {
	r := newTestRunner(t, testConfig())
	r.engine.Observe(levels(&sampler.WaterLevel{At: time.Now(), Mem: 0.95, MemValid: true}))
	assert.Nil(t, r.status.transitions)
	assert.Empty(t, r.status.live().Transitions)
}

// The page shows the soft memory limit and the GC percent in force, as the
// runtime reports them, and who set them, as the start log says.
func TestStatusPageGoRuntime(t *testing.T) {
	r, logs := newStartedRunner(t, componenttest.NewNopTelemetrySettings(), testConfig(statusPageConfig), func(r *Runner) {
		assert.Empty(t, r.status.live().Go.MemoryLimitSetBy, "nothing decided before Start")
	})
	got := r.status.live().Go
	started := logs.FilterMessage("throttle started").All()
	require.Len(t, started, 1)
	f := started[0].ContextMap()
	assert.Equal(t, f["go_memory_limit"], got.MemoryLimitSetBy)
	assert.Equal(t, f["gc_pace"], got.GCPercentSetBy)

	limit := debug.SetMemoryLimit(-1)
	if limit == math.MaxInt64 {
		limit = 0
	}
	assert.Equal(t, limit, got.MemoryLimit)
	gogc := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(gogc)
	if p := gogc[0].Value.Uint64(); p < math.MaxInt32 {
		assert.EqualValues(t, p, got.GCPercent)
	} else {
		assert.Zero(t, got.GCPercent, "GOGC=off")
	}
}

// The page shows the configuration as users write it: the keys are the
// mapstructure tags, durations read as durations, secrets are masked, and
// a number JSON cannot hold does not lose the rest.
func TestEffectiveConfig(t *testing.T) {
	type section struct {
		Wait   time.Duration       `mapstructure:"wait"`
		Secret configopaque.String `mapstructure:"secret"`
	}
	type config struct {
		Interval time.Duration `mapstructure:"check_interval"`
		Ratio    float64       `mapstructure:"ratio"`
		Section  section       `mapstructure:"section"`
		List     []string      `mapstructure:"list"`
		Off      *section      `mapstructure:"off"`
	}
	got, err := effectiveConfig(&config{
		Interval: 250 * time.Millisecond,
		Ratio:    math.NaN(),
		Section:  section{Wait: 90 * time.Second, Secret: "hunter2"},
		List:     []string{"a", "b"},
	})
	require.NoError(t, err)
	assert.Equal(t, map[string]any{
		"check_interval": "250ms",
		"ratio":          "NaN",
		"section":        map[string]any{"wait": "1m30s", "secret": "[REDACTED]"},
		"list":           []any{"a", "b"},
		"off":            nil,
	}, got)
	b, err := json.Marshal(got)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "hunter2")

	got, err = effectiveConfig(nil)
	require.NoError(t, err)
	assert.Nil(t, got)
}

// newStatus shows the runner's Effective configuration on the page only.
func TestStatusInfoConfig(t *testing.T) {
	type config struct {
		Interval time.Duration `mapstructure:"check_interval"`
	}
	eff := func(c *Config) { c.Effective = &config{Interval: time.Second}; c.ObserveOnly = true }
	r := newTestRunner(t, testConfig(statusPageConfig, eff))
	assert.Equal(t, map[string]any{"check_interval": "1s"}, r.status.statusInfo().Config)
	assert.True(t, r.status.statusInfo().ObserveOnly)
	assert.Nil(t, newTestRunner(t, testConfig(eff)).status.statusInfo().Config)
}
