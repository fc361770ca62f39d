// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// idAttr is the component ID attribute metadatatest.NewSettings gives.
var idAttr = attribute.String("extension", "throttle")

func newTestTelemetry(t *testing.T) *componenttest.Telemetry {
	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tt.Shutdown(context.Background())) })
	return tt
}

// wantLevels is the water_level gauge with CPU at 0 (constant CPU time),
// memory at mem, and the default lines.
func wantLevels(mem float64) []metricdata.DataPoint[float64] {
	kv := []struct {
		kind string
		v    float64
	}{
		{"cpu", 0},
		{"cpu_slow", 0},
		{"cpu_fast", 0},
		{"memory", mem},
		{"memory_working_set", mem},
		{"memory_heap_spare", 0},
		{"memory_heap_held_back", 0},
		{"cpu_enter", 0.90},
		{"cpu_exit", 0.80},
		{"cpu_hard", 1.10},
		{"memory_enter", 0.85},
		{"memory_exit", 0.78},
		{"memory_hard", 0.92},
	}
	dps := make([]metricdata.DataPoint[float64], 0, len(kv))
	for _, p := range kv {
		dps = append(dps, metricdata.DataPoint[float64]{
			Attributes: attribute.NewSet(idAttr, attribute.String("kind", p.kind)),
			Value:      p.v,
		})
	}
	return dps
}

func wantStates(st decision.State) []metricdata.DataPoint[int64] {
	var dps []metricdata.DataPoint[int64]
	for _, s := range allSignals {
		dps = append(dps, metricdata.DataPoint[int64]{
			Attributes: attribute.NewSet(idAttr, attribute.String("signal", s.String())),
			Value:      int64(st),
		})
	}
	return dps
}

// wantInflight is throttle_inflight_bytes with nothing reserved.
func wantInflight(limit int64) []metricdata.DataPoint[int64] {
	return []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(idAttr, attribute.String("budget", "reserved")), Value: 0},
		{Attributes: attribute.NewSet(idAttr, attribute.String("budget", "limit")), Value: limit},
	}
}

// requestCounts is the expected throttle_requests, cumulative.
type requestCounts map[[3]string]int64 // protocol, signal, reason ("" = allowed)

func (c requestCounts) add(p string, s decision.Signal, v decision.Verdict) {
	c[[3]string{p, s.String(), v.Reason()}]++
}

func (c requestCounts) dps() []metricdata.DataPoint[int64] {
	var dps []metricdata.DataPoint[int64]
	for k, n := range c {
		attrs := []attribute.KeyValue{idAttr, attribute.String("protocol", k[0]), attribute.String("signal", k[1])}
		if k[2] == "" {
			attrs = append(attrs, attribute.String("decision", "allowed"))
		} else {
			attrs = append(attrs, attribute.String("decision", "denied"), attribute.String("reason", k[2]))
		}
		dps = append(dps, metricdata.DataPoint[int64]{Attributes: attribute.NewSet(attrs...), Value: n})
	}
	return dps
}

// inflightReserved reads budget=reserved from the gauge.
func inflightReserved(t *testing.T, tt *componenttest.Telemetry) int64 {
	m, err := tt.GetMetric("otelcol_throttle_inflight_bytes")
	require.NoError(t, err)
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		if v, _ := dp.Attributes.Value("budget"); v.AsString() == "reserved" {
			return dp.Value
		}
	}
	t.Fatal("no budget=reserved point")
	return 0
}

// TestTelemetryThroughSeam drives the state through the fake source and
// checks every metric, exactly, after each step.
func TestTelemetryThroughSeam(t *testing.T) {
	ctx := context.Background()
	tt := newTestTelemetry(t)
	src := newFakeSource(50)
	e := startTestExtension(t, src, testConfig(t), metadatatest.NewSettings(tt))

	// auto with a 100 MiB limit: 100MiB/12, inside the [4MiB, 256MiB] clamp.
	const budget = 8738133
	require.Equal(t, int64(budget), int64(admission.AutoInflightBudget().Resolve(testMemLimit, 0)))

	// A tiny receiver behind the HTTP middleware: it reads the first byte
	// of the body (nothing is reserved before one arrives), or the whole
	// body with readAll, answers 429 when the read is refused, records the
	// reserved bytes it sees, then runs during (if set) while its request
	// still holds its reservation.
	var seenReserved int64
	var during func()
	readAll := false
	wrap, err := e.GetHTTPHandler(ctx)
	require.NoError(t, err)
	h, err := wrap(ctx, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var err error
		if readAll {
			_, err = io.Copy(io.Discard, r.Body)
		} else {
			_, err = r.Body.Read(make([]byte, 1))
		}
		if err != nil && !errors.Is(err, io.EOF) {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		seenReserved = inflightReserved(t, tt)
		if f := during; f != nil {
			during = nil
			f()
		}
		w.WriteHeader(http.StatusOK)
	}))
	require.NoError(t, err)
	postN := func(path string, contentLength int64, size int) int {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(strings.Repeat("x", size)))
		req.ContentLength = contentLength
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	post := func(path string, contentLength int64) int { return postN(path, contentLength, 1000) }
	paths := map[decision.Signal]string{
		decision.SignalTraces: "/v1/traces", decision.SignalMetrics: "/v1/metrics",
		decision.SignalLogs: "/v1/logs", decision.SignalProfiles: "/v1development/profiles",
	}
	want := requestCounts{}
	assertRequests := func() {
		t.Helper()
		metadatatest.AssertEqualThrottleRequests(t, tt, want.dps(), metricdatatest.IgnoreTimestamp())
	}

	// Step 1: Normal at 50%.
	waitLevel(t, tt, 0.5)
	metadatatest.AssertEqualThrottleState(t, tt, wantStates(decision.StateNormal), metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualThrottleWaterLevel(t, tt, wantLevels(0.5), metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualThrottleInflightBytes(t, tt, wantInflight(budget), metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualThrottleHeldRequests(t, tt, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(idAttr), Value: 0},
	}, metricdatatest.IgnoreTimestamp())
	// An injected source leaves the process's pace alone: the gauge shows
	// the runtime's.
	metadatatest.AssertEqualThrottleGcPercent(t, tt, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(idAttr), Value: int64(gcPercent())},
	}, metricdatatest.IgnoreTimestamp())
	// The demand signal is reported (its arithmetic: runner's TestDemand).
	metadatatest.AssertEqualThrottleDemand(t, tt, []metricdata.DataPoint[float64]{
		{Attributes: attribute.NewSet(idAttr)},
	}, metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreValue())
	for _, s := range allSignals {
		seenReserved = -1
		require.Equal(t, http.StatusOK, post(paths[s], 1000), s.String())
		want.add("http", s, decision.VerdictAdmit)
		// An exempt signal (metrics here) is bounded by the budget too.
		assert.Equal(t, int64(1000), seenReserved, "reserved while %s is handled", s)
	}
	require.Equal(t, http.StatusOK, post("/health", 1000), "unclassified")
	e.RecordProcessorDecision(decision.SignalTraces, decision.VerdictAdmit)
	want.add("processor", decision.SignalTraces, decision.VerdictAdmit)
	assertRequests()
	metadatatest.AssertEqualThrottleInflightBytes(t, tt, wantInflight(budget), metricdatatest.IgnoreTimestamp())

	// Step 2: Open at 95%.
	src.SetMemoryShare(0.95)
	waitState(t, e, decision.StateOpen)
	waitLevel(t, tt, 0.95)
	metadatatest.AssertEqualThrottleState(t, tt, wantStates(decision.StateOpen), metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualThrottleWaterLevel(t, tt, wantLevels(0.95), metricdatatest.IgnoreTimestamp())
	require.Equal(t, http.StatusTooManyRequests, post(paths[decision.SignalTraces], 1000))
	want.add("http", decision.SignalTraces, decision.VerdictDenyOpen)
	require.Equal(t, http.StatusTooManyRequests, post(paths[decision.SignalMetrics], 1000), "metrics is exempt, but not at the memory backstop")
	want.add("http", decision.SignalMetrics, decision.VerdictDenyOpen)
	require.Equal(t, http.StatusTooManyRequests, post(paths[decision.SignalLogs], 1000))
	want.add("http", decision.SignalLogs, decision.VerdictDenyOpen)
	e.RecordProcessorDecision(decision.SignalLogs, decision.VerdictDenyOpen)
	want.add("processor", decision.SignalLogs, decision.VerdictDenyOpen)
	e.runner.Record(admission.ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyOpen)
	want.add("grpc", decision.SignalTraces, decision.VerdictDenyOpen)
	assertRequests()

	// Step 3: Shedding at 87% (below hard, above exit).
	src.SetMemoryShare(0.87)
	waitState(t, e, decision.StateShedding)
	waitLevel(t, tt, 0.87)
	metadatatest.AssertEqualThrottleState(t, tt, wantStates(decision.StateShedding), metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualThrottleWaterLevel(t, tt, wantLevels(0.87), metricdatatest.IgnoreTimestamp())
	e.RecordProcessorDecision(decision.SignalTraces, decision.VerdictDenyShed)
	want.add("processor", decision.SignalTraces, decision.VerdictDenyShed)
	e.runner.Record(admission.ProtocolGRPC, decision.SignalProfiles, decision.VerdictAdmit)
	want.add("grpc", decision.SignalProfiles, decision.VerdictAdmit)
	assertRequests()

	// Step 4: Normal again at 50%; a body reserves, once its first byte
	// has come, its Content-Length, or unknown_size if that is smaller,
	// also when it is larger than the budget and another request holds part
	// of it; a request of a client that holds its whole share is denied by
	// the budget before its body is read; nothing stays reserved.
	src.SetMemoryShare(0.5)
	waitState(t, e, decision.StateNormal)
	waitLevel(t, tt, 0.5)
	metadatatest.AssertEqualThrottleState(t, tt, wantStates(decision.StateNormal), metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualThrottleWaterLevel(t, tt, wantLevels(0.5), metricdatatest.IgnoreTimestamp())
	innerCode := 0
	during = func() { innerCode = post(paths[decision.SignalTraces], budget+1) }
	require.Equal(t, http.StatusOK, post(paths[decision.SignalTraces], 1000))
	want.add("http", decision.SignalTraces, decision.VerdictAdmit)
	require.Equal(t, http.StatusOK, innerCode, "larger than the budget, while another request holds 1000 bytes")
	want.add("http", decision.SignalTraces, decision.VerdictAdmit)
	assert.Equal(t, int64(1000+admission.DefaultUnknownSize), seenReserved, "1000 bytes and the larger request's unknown_size")
	// A client alone may hold half of the budget (fairness.share).
	readAll = true
	during = func() { readAll = false; innerCode = post(paths[decision.SignalTraces], 1000) }
	require.Equal(t, http.StatusOK, postN(paths[decision.SignalTraces], budget/2, budget/2))
	want.add("http", decision.SignalTraces, decision.VerdictAdmit)
	require.Equal(t, http.StatusTooManyRequests, innerCode, "its client holds its whole share")
	want.add("http", decision.SignalTraces, decision.VerdictDenyBudget)
	require.Equal(t, http.StatusOK, post(paths[decision.SignalTraces], 500))
	want.add("http", decision.SignalTraces, decision.VerdictAdmit)
	assert.Equal(t, int64(500), seenReserved, "a Content-Length below unknown_size is reserved exactly")
	e.RecordProcessorDecision(decision.SignalProfiles, decision.VerdictDenyBudget)
	want.add("processor", decision.SignalProfiles, decision.VerdictDenyBudget)
	assertRequests()
	metadatatest.AssertEqualThrottleInflightBytes(t, tt, wantInflight(budget), metricdatatest.IgnoreTimestamp())

	// The sampler histograms: one point with the component ID, counts > 0,
	// the declared buckets.
	for name, bounds := range map[string][]float64{
		"otelcol_throttle_sampler_interval": {0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 1, 2, 5},
		"otelcol_throttle_sampler_duration": {0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05},
	} {
		m, err := tt.GetMetric(name)
		require.NoError(t, err)
		dps := m.Data.(metricdata.Histogram[float64]).DataPoints
		require.Len(t, dps, 1, name)
		assert.Equal(t, attribute.NewSet(idAttr), dps[0].Attributes, name)
		assert.Positive(t, dps[0].Count, name)
		assert.Equal(t, bounds, dps[0].Bounds, name)
	}
	hist := []metricdata.HistogramDataPoint[float64]{{Attributes: attribute.NewSet(idAttr)}}
	metadatatest.AssertEqualThrottleSamplerInterval(t, tt, hist, metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreValue())
	metadatatest.AssertEqualThrottleSamplerDuration(t, tt, hist, metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreValue())
}

// TestTelemetryBudgetReserved checks budget=limit for a fixed budget and
// the disabled budget (0 = off: no limit, nothing reserved).
func TestTelemetryBudgetSettings(t *testing.T) {
	for name, tc := range map[string]struct {
		budget admission.InflightBudget
		limit  int64
	}{
		"fixed": {admission.FixedInflightBudget(24 << 20), 24 << 20},
		"off":   {admission.FixedInflightBudget(0), 0},
	} {
		t.Run(name, func(t *testing.T) {
			tt := newTestTelemetry(t)
			startTestExtension(t, newFakeSource(50), testConfig(t, func(c *Config) {
				c.Admission.MaxInflightBytes = tc.budget
			}), metadatatest.NewSettings(tt))
			metadatatest.AssertEqualThrottleInflightBytes(t, tt, wantInflight(tc.limit), metricdatatest.IgnoreTimestamp())
		})
	}
}

// TestTelemetryDisabledSlot checks that a disabled slot's lines are not
// reported, and that levels are absent before the sampler starts.
func TestTelemetryDisabledSlot(t *testing.T) {
	tt := newTestTelemetry(t)
	e := newTestExtension(t, newFakeSource(50), testConfig(t, func(c *Config) {
		c.CPU.Enabled = false
	}), metadatatest.NewSettings(tt))
	var lines, levels []metricdata.DataPoint[float64]
	for _, dp := range wantLevels(0.5) {
		k, _ := dp.Attributes.Value("kind")
		switch {
		case slices.Contains([]string{"memory_enter", "memory_exit", "memory_hard"}, k.AsString()):
			lines = append(lines, dp)
		case !strings.HasSuffix(k.AsString(), "_enter") && !strings.HasSuffix(k.AsString(), "_exit") && !strings.HasSuffix(k.AsString(), "_hard"):
			levels = append(levels, dp)
		}
	}
	// Not started: only the lines.
	metadatatest.AssertEqualThrottleWaterLevel(t, tt, lines, metricdatatest.IgnoreTimestamp())
	require.NoError(t, e.Start(context.Background(), componenttest.NewNopHost()))
	waitLevel(t, tt, 0.5)
	metadatatest.AssertEqualThrottleWaterLevel(t, tt, append(lines, levels...), metricdatatest.IgnoreTimestamp())
}

// errFakeRead is the memory read failure of TestSamplerErrors.
var errFakeRead = errors.New("fake: memory.usage_in_bytes: read failed")

// TestSamplerErrors makes the memory read fail three times: each failure
// is counted with resource=mem, and logged once.
func TestSamplerErrors(t *testing.T) {
	tt := newTestTelemetry(t)
	core, logs := observer.New(zapcore.InfoLevel)
	set := metadatatest.NewSettings(tt)
	set.Logger = zap.New(core)
	src := newFakeSource(50)
	src.FailNext(testutil.WorkingSet, 3, errFakeRead)
	startTestExtension(t, src, testConfig(t), set)

	memErrors := func() int64 {
		m, err := tt.GetMetric("otelcol_throttle_sampler_errors")
		if err != nil {
			return 0
		}
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			if v, _ := dp.Attributes.Value("resource"); v.AsString() == "memory" {
				return dp.Value
			}
		}
		return 0
	}
	require.Eventually(t, func() bool { return memErrors() == 3 }, 10*time.Second, time.Millisecond)
	// Memory reads again: the level is valid and the count stays.
	waitLevel(t, tt, 0.5)
	assert.Equal(t, int64(3), memErrors())

	m, err := tt.GetMetric("otelcol_throttle_sampler_errors")
	require.NoError(t, err)
	sum := m.Data.(metricdata.Sum[int64])
	assert.True(t, sum.IsMonotonic)
	for _, dp := range sum.DataPoints {
		r, _ := dp.Attributes.Value("resource")
		// Skipped CPU windows (timer jitter) may be counted under cpu;
		// every point carries the component ID.
		assert.Contains(t, []string{"memory", "cpu"}, r.AsString())
		id, _ := dp.Attributes.Value("extension")
		assert.Equal(t, "throttle", id.AsString())
		assert.Equal(t, 2, dp.Attributes.Len())
	}

	warns := logs.FilterLevelExact(zapcore.WarnLevel).FilterField(zap.String("resource", "memory")).All()
	require.Len(t, warns, 1, "a failing read is logged once per 30s, not per tick")
	assert.Contains(t, warns[0].ContextMap()["error"], errFakeRead.Error())
}
