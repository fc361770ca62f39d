// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// idAttr is the component ID attribute of the telemetry built below.
var idAttr = attribute.String("extension", "throttle")

// quietSources are telemetry sources of a throttle in Normal with nothing
// in flight, whose sampler publishes wl (nil: nothing yet).
func quietSources(wl *sampler.WaterLevel) telemetrySources {
	return telemetrySources{
		level:  func() *sampler.WaterLevel { return wl },
		state:  func(decision.Signal) decision.State { return decision.StateNormal },
		budget: func() (int64, int64) { return 0, 0 },
		stale:  func() bool { return false },
		held:   func() int64 { return 0 },
		// The resources of the extension's defaults.
		resources: testResources(),
		slots:     testSlots(),
	}
}

func newTestTelemetry(t *testing.T) *componenttest.Telemetry {
	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tt.Shutdown(context.Background())) })
	return tt
}

// TestRecordResourceFallback checks that an unknown resource is counted as
// limits (the metric's enum has no other value) rather than dropped.
func TestRecordResourceFallback(t *testing.T) {
	tt := newTestTelemetry(t)
	tel, err := newTelemetry(tt.NewTelemetrySettings(), component.MustNewID("throttle"), false, quietSources(nil))
	require.NoError(t, err)
	defer tel.shutdown()
	tel.samplerError("limits")
	tel.samplerError("something")
	metadatatest.AssertEqualThrottleSamplerErrors(t, tt, []metricdata.DataPoint[int64]{
		{Attributes: attribute.NewSet(idAttr, attribute.String("resource", "limits")), Value: 2},
	}, metricdatatest.IgnoreTimestamp())
	// Out-of-range inputs are ignored, not a panic.
	tel.record(admission.ProtocolHTTP, decision.NumSignals, decision.VerdictAdmit)
	tel.record(admission.ProtocolHTTP, decision.SignalTraces, decision.NumVerdicts)
	tel.record(admission.NumProtocols, decision.SignalTraces, decision.VerdictAdmit)
	_, err = tt.GetMetric("otelcol_throttle_requests")
	require.Error(t, err, "nothing recorded")
}

// BenchmarkRecord is the request path's telemetry: it must not allocate.
func BenchmarkRecord(b *testing.B) {
	tt := componenttest.NewTelemetry()
	defer func() { _ = tt.Shutdown(context.Background()) }()
	tel, err := newTelemetry(tt.NewTelemetrySettings(), component.MustNewID("throttle"), false, quietSources(nil))
	require.NoError(b, err)
	defer tel.shutdown()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tel.record(admission.Protocol(i%int(admission.NumProtocols)), decision.Signal(i%int(decision.NumSignals)), decision.Verdict(i%4))
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	tt := newTestTelemetry(t)
	tel, err := newTelemetry(tt.NewTelemetrySettings(), component.MustNewID("throttle"), false, quietSources(nil))
	require.NoError(t, err)
	defer tel.shutdown()
	tel.record(admission.ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit) // first use creates the series
	allocs := testing.AllocsPerRun(1000, func() {
		tel.record(admission.ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit)
		tel.record(admission.ProtocolGRPC, decision.SignalLogs, decision.VerdictDenyOpen)
	})
	assert.Zero(t, allocs)
}

// TestWaterLevelHeapCorrections checks that the two corrections of the
// memory level are reported beside it, as shares of the limit, so that an
// operator can tell why the level the lines apply to is not the working set.
func TestWaterLevelHeapCorrections(t *testing.T) {
	const limit = 1000
	f := func(ws, spare, heldBack uint64, mem float64) {
		t.Helper()
		tt := newTestTelemetry(t)
		wl := levels(&sampler.WaterLevel{
			MemValid: true, Mem: mem, WorkingSet: ws, MemLimit: limit, HeapSpare: spare, HeapHeldBack: heldBack,
		})
		tel, err := newTelemetry(tt.NewTelemetrySettings(), component.MustNewID("throttle"), false, quietSources(wl))
		require.NoError(t, err)
		defer tel.shutdown()
		m, err := tt.GetMetric("otelcol_throttle_water_level")
		require.NoError(t, err)
		got := map[string]float64{}
		for _, dp := range m.Data.(metricdata.Gauge[float64]).DataPoints {
			k, _ := dp.Attributes.Value("kind")
			got[k.AsString()] = dp.Value
		}
		assert.InDelta(t, mem, got["memory"], 1e-9)
		assert.InDelta(t, float64(ws)/limit, got["memory_working_set"], 1e-9)
		assert.InDelta(t, float64(spare)/limit, got["memory_heap_spare"], 1e-9)
		assert.InDelta(t, float64(heldBack)/limit, got["memory_heap_held_back"], 1e-9)
	}
	f(800, 0, 0, 0.8)
	f(800, 300, 0, 0.5)
	f(800, 100, 50, 0.75)
}

// TestObserveOnlyLabelsDenials checks what tells an operator that
// observe_only is on: the start log line says so, and the requests it would
// have refused are counted as decision=would_deny, never as denied, so that
// dashboards and alerts on real refusals stay quiet while it is on.
func TestObserveOnlyLabelsDenials(t *testing.T) {
	for _, observeOnly := range []bool{false, true} {
		t.Run(strconv.FormatBool(observeOnly), func(t *testing.T) {
			tt := newTestTelemetry(t)
			r, logs := newStartedRunner(t, tt.NewTelemetrySettings(), testConfig(func(c *Config) { c.ObserveOnly = observeOnly }))

			started := logs.FilterMessage("throttle started").All()
			require.Len(t, started, 1)
			assert.Equal(t, observeOnly, started[0].ContextMap()["observe_only"])

			r.Record(admission.ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit)
			r.Record(admission.ProtocolHTTP, decision.SignalTraces, decision.VerdictDenyShed)
			r.RecordProcessorDecision(decision.SignalLogs, decision.VerdictDenyBudget)
			denied := "denied"
			if observeOnly {
				denied = "would_deny"
			}
			attrs := func(protocol, signal, decision, reason string) attribute.Set {
				kv := []attribute.KeyValue{
					idAttr, attribute.String("protocol", protocol), attribute.String("signal", signal),
					attribute.String("decision", decision),
				}
				if reason != "" {
					kv = append(kv, attribute.String("reason", reason))
				}
				return attribute.NewSet(kv...)
			}
			metadatatest.AssertEqualThrottleRequests(t, tt, []metricdata.DataPoint[int64]{
				{Attributes: attrs("http", "traces", "allowed", ""), Value: 1},
				{Attributes: attrs("http", "traces", denied, "shed"), Value: 1},
				{Attributes: attrs("processor", "logs", denied, "budget"), Value: 1},
			}, metricdatatest.IgnoreTimestamp())
		})
	}
}

// TestCutOffsCounted: an admitted request cut off is counted apart from the
// decisions, by protocol, signal and reason, so that the requests counted
// allowed and then answered with a retry can be told from those delivered.
func TestCutOffsCounted(t *testing.T) {
	tt := newTestTelemetry(t)
	r, _ := newStartedRunner(t, tt.NewTelemetrySettings(), testConfig())
	r.Record(admission.ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit)
	r.CutOff(admission.ProtocolHTTP, decision.SignalTraces, admission.CutSlow)
	r.CutOff(admission.ProtocolHTTP, decision.SignalTraces, admission.CutSlow)
	r.CutOff(admission.ProtocolGRPC, decision.SignalLogs, admission.CutStopping)
	r.CutOff(admission.ProtocolHTTP, decision.SignalMetrics, admission.NumCutReasons) // out of range: ignored
	attrs := func(protocol, signal, reason string) attribute.Set {
		return attribute.NewSet(idAttr, attribute.String("protocol", protocol), attribute.String("signal", signal),
			attribute.String("reason", reason))
	}
	metadatatest.AssertEqualThrottleCutOffRequests(t, tt, []metricdata.DataPoint[int64]{
		{Attributes: attrs("http", "traces", "slow"), Value: 2},
		{Attributes: attrs("grpc", "logs", "stopping"), Value: 1},
	}, metricdatatest.IgnoreTimestamp())
}
