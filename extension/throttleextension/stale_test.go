// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// waitTicksBlocked lets a few more watchdog ticks pass while the sampler is
// blocked, so that a Warn per tick would show. There is nothing to wait on
// in a ticker that must not fire, so this one sleeps.
// shortestStaleAfter is the shortest stale_after the configuration takes.
const shortestStaleAfter = time.Second

func waitTicksBlocked() { time.Sleep(100 * time.Millisecond) }

// staleGauge reads throttle_sampler_stale (-1 when not reported).
func staleGauge(t *testing.T, tel *componenttest.Telemetry) int64 {
	m, err := tel.GetMetric("otelcol_throttle_sampler_stale")
	require.NoError(t, err)
	g, ok := m.Data.(metricdata.Gauge[int64])
	require.True(t, ok, "%T", m.Data)
	if len(g.DataPoints) != 1 {
		return -1
	}
	return g.DataPoints[0].Value
}

// watchdogRunning reports whether a stale watchdog's goroutine runs in
// this process.
func watchdogRunning() bool {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return bytes.Contains(buf[:n], []byte("(*staleWatchdog).run"))
}

func observedSettings(level zapcore.Level) (*observer.ObservedLogs, func() *zap.Logger) {
	core, logs := observer.New(level)
	return logs, func() *zap.Logger { return zap.New(core) }
}

// TestStaleLevelFallsBackToAdmit: the sampler blocks in a read while the
// collector is Open. After stale_after without a fresh sample,
// every signal is admitted, the gauge is 1 and a Warn is logged once; when
// the read returns, the fresh level rules again (still Open), the gauge is 0
// and an Info says so.
func TestStaleLevelFallsBackToAdmit(t *testing.T) {
	verifyNoLeaks(t)
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := metadatatest.NewSettings(tel)
	logs, logger := observedSettings(zapcore.InfoLevel)
	set.Logger = logger()

	src := newFakeSource(95) // over mem hard: Open
	// The shortest stale_after there is: short for the test, long enough
	// that a sampler starved by a loaded -race run does not start a second
	// episode after the release.
	cfg := testConfig(t, func(c *Config) { c.StaleAfter = shortestStaleAfter })
	require.Equal(t, time.Second, cfg.runnerConfig().StaleAfter)
	e := startTestExtension(t, src, cfg, set)
	waitState(t, e, decision.StateOpen)
	require.Equal(t, decision.VerdictDenyOpen, e.Decide(decision.SignalTraces))
	require.Equal(t, int64(0), staleGauge(t, tel))

	release := src.BlockCPUTime(t)
	require.Eventually(t, func() bool { return e.Decide(decision.SignalTraces) == decision.VerdictAdmit }, 10*time.Second, time.Millisecond,
		"a blocked sampler must not hold Open for ever")
	for _, s := range allSignals {
		assert.Equal(t, decision.VerdictAdmit, e.Decide(s), s.String())
		assert.Equal(t, decision.StateNormal, e.State(s), s.String())
	}
	metadatatest.AssertEqualThrottleSamplerStale(t, tel, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(attribute.String("extension", "throttle")), Value: 1},
	}, metricdatatest.IgnoreTimestamp())
	// The Warn follows the fallback on the watchdog's goroutine.
	require.Eventually(t, func() bool { return logs.FilterMessageSnippet("no fresh water level").Len() > 0 },
		10*time.Second, time.Millisecond)
	waitTicksBlocked()
	warns := logs.FilterMessageSnippet("no fresh water level").All()
	require.Len(t, warns, 1, "one Warn per stale episode, not one per tick")
	assert.Equal(t, zapcore.WarnLevel, warns[0].Level)
	assert.Equal(t, time.Second, warns[0].ContextMap()["stale_after"])
	assert.GreaterOrEqual(t, warns[0].ContextMap()["since_last_sample"], time.Second)

	release()
	require.Eventually(t, func() bool { return e.Decide(decision.SignalTraces) == decision.VerdictDenyOpen }, 10*time.Second, time.Millisecond,
		"the first fresh sample restores the real decision")
	require.Eventually(t, func() bool { return staleGauge(t, tel) == 0 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		return logs.FilterMessageSnippet("fresh water level again").FilterLevelExact(zapcore.InfoLevel).Len() == 1
	}, 10*time.Second, time.Millisecond)
	assert.Len(t, logs.FilterMessageSnippet("no fresh water level").All(), 1)

	require.NoError(t, e.Shutdown(context.Background()))
}

// TestStaleAfterZeroHolds: stale_after: 0 holds the last level however
// long the sampler is stuck.
func TestStaleAfterZeroHolds(t *testing.T) {
	verifyNoLeaks(t)
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	src := newFakeSource(95)
	e := startTestExtension(t, src, testConfig(t), metadatatest.NewSettings(tel)) // testConfig: 0
	require.False(t, watchdogRunning(), "no stale watchdog")
	waitState(t, e, decision.StateOpen)
	release := src.BlockCPUTime(t)
	// Longer than the shortest stale_after there is.
	assert.Never(t, func() bool { return e.Decide(decision.SignalTraces) != decision.VerdictDenyOpen }, shortestStaleAfter+200*time.Millisecond, 5*time.Millisecond)
	assert.Equal(t, int64(0), staleGauge(t, tel))
	release()
	require.NoError(t, e.Shutdown(context.Background()))
}

// TestStaleWatchdogStopsAtShutdown: the watchdog goroutine is gone after
// Shutdown, with or without a stale episode, and a second Shutdown is fine.
func TestStaleWatchdogStopsAtShutdown(t *testing.T) {
	verifyNoLeaks(t)
	e := startTestExtension(t, newFakeSource(50), testConfig(t, func(c *Config) { c.StaleAfter = time.Second }), nopSettings())
	// Eventually: the goroutine Start created may not have run its first
	// instruction yet, and its stack then names only the WaitGroup's wrapper.
	require.Eventually(t, watchdogRunning, 10*time.Second, time.Millisecond, "stale watchdog started")
	require.NoError(t, e.Shutdown(context.Background()))
	require.NoError(t, e.Shutdown(context.Background()))
}

// TestShutdownDoesNotHangOnABlockedRead: a source read stuck in the kernel
// must not hang the collector's shutdown past its context.
func TestShutdownDoesNotHangOnABlockedRead(t *testing.T) {
	src := newFakeSource(10)
	e := startTestExtension(t, src, testConfig(t), nopSettings())
	release := src.BlockCPUTime(t)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := e.Shutdown(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "sampler did not stop")

	// Once the read returns, the sampler goroutine ends (goleak checks it
	// after the test) and a second Shutdown is a no-op.
	release()
	require.NoError(t, e.Shutdown(context.Background()))
}

// TestStaleFallbackReportsStatus: when the watchdog starts admitting on a
// stale level, the reported status follows at once, without waiting for a
// sample that a stuck sampler will not publish.
func TestStaleFallbackReportsStatus(t *testing.T) {
	src := newFakeSource(95) // over mem hard: Open
	cfg := testConfig(t, func(c *Config) {
		c.StaleAfter = shortestStaleAfter
		c.ReportStatus = true
	})
	e := newTestExtension(t, src, cfg, nopSettings())
	host := testutil.NewStatusHost()
	require.NoError(t, e.Start(context.Background(), host))
	require.Equal(t, componentstatus.StatusRecoverableError, host.Next(t).Status())

	release := src.BlockCPUTime(t)
	require.Equal(t, componentstatus.StatusOK, host.Next(t).Status(), "stale fallback admits: OK")
	release()
	require.Equal(t, componentstatus.StatusRecoverableError, host.Next(t).Status(), "fresh level, Open again")
}
