// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package exporters

// End-to-end tests of the throttle processor (repository root) with a real
// otlphttpexporter as the client: otlpreceiver -> processor -> sink, the
// processor following a fake throttle or the real extension.

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/exportertest"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	throttleprocessor "github.com/otelthrottle/throttle"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/throttletest"
)

// throttleDriver puts the throttle the processor follows in Open and back.
type throttleDriver interface {
	host() component.Host
	overload(t testing.TB)
	calm(t testing.TB)
	// retryRange is the range RetryDelay draws from.
	retryRange() (minDelay, maxDelay time.Duration)
}

// fakeDriver drives a throttletest.Fake: it checks the wiring even without
// the extension's sampler and state machines.
type fakeDriver struct{ fake *throttletest.Fake }

const fakeDriverDelay = 1500 * time.Millisecond

func newFakeDriver(*testing.T) throttleDriver {
	return fakeDriver{fake: throttletest.NewFake(fakeDriverDelay)}
}

func (d fakeDriver) host() component.Host { return throttletest.HostWith(defaultExtensionID, d.fake) }

func (d fakeDriver) overload(testing.TB) { d.fake.SetAll(decision.VerdictDenyOpen) }

func (d fakeDriver) calm(testing.TB) { d.fake.SetAll(decision.VerdictAdmit) }

func (fakeDriver) retryRange() (time.Duration, time.Duration) {
	return fakeDriverDelay, fakeDriverDelay
}

// realDriver drives the real extension through its water level.
type realDriver struct{ rt *throttletest.Real }

func (d realDriver) host() component.Host { return throttletest.HostWith(defaultExtensionID, d.rt.Ext) }

func (d realDriver) overload(tb testing.TB) {
	d.rt.SetLevel(tb, throttletest.Overloaded, decision.StateOpen)
}

func (d realDriver) calm(tb testing.TB) { d.rt.SetLevel(tb, throttletest.Calm, decision.StateNormal) }

func (realDriver) retryRange() (time.Duration, time.Duration) {
	return throttletest.MinRetry, throttletest.MaxRetry
}

var drivers = []struct {
	name  string
	start func(t *testing.T) throttleDriver
}{
	{"fake_throttle", newFakeDriver},
	{"throttle_extension", func(t *testing.T) throttleDriver { return realDriver{throttletest.StartReal(t)} }},
}

// e2ePipeline is otlpreceiver (HTTP, no middleware) -> throttle processor ->
// sink, all started with the same host.
type e2ePipeline struct {
	addr string
	sink *consumertest.TracesSink
	tel  *componenttest.Telemetry
}

func startE2EPipeline(t *testing.T, host component.Host, onReject throttleprocessor.OnReject) *e2ePipeline {
	t.Helper()
	ctx := context.Background()
	p := &e2ePipeline{addr: freeAddr(t), sink: new(consumertest.TracesSink), tel: componenttest.NewTelemetry()}

	proc, err := throttleprocessor.NewFactory().CreateTraces(ctx, metadatatest.NewSettings(p.tel),
		&throttleprocessor.Config{Extension: defaultExtensionID, OnReject: onReject}, p.sink)
	require.NoError(t, err)
	require.NoError(t, proc.Start(ctx, host))
	t.Cleanup(func() {
		require.NoError(t, proc.Shutdown(ctx))
		require.NoError(t, p.tel.Shutdown(ctx))
	})

	rf := otlpreceiver.NewFactory()
	rcfg := rf.CreateDefaultConfig()
	require.NoError(t, confmap.NewFromStringMap(map[string]any{
		"protocols": map[string]any{"http": map[string]any{"endpoint": p.addr}},
	}).Unmarshal(rcfg))
	require.NoError(t, confmap.Validate(rcfg))
	rcv, err := rf.CreateTraces(ctx, receivertest.NewNopSettings(rf.Type()), rcfg, proc)
	require.NoError(t, err)
	require.NoError(t, rcv.Start(ctx, host))
	t.Cleanup(func() { require.NoError(t, rcv.Shutdown(ctx)) })
	return p
}

// startExporter starts an otlphttpexporter sending to addr, without a queue
// (ConsumeTraces returns when the batch is delivered or given up) and with
// retries on a short back-off; the logs show its retries.
func startExporter(t *testing.T, addr string) (exporter.Traces, *observer.ObservedLogs) {
	t.Helper()
	ctx := context.Background()
	ef := otlphttpexporter.NewFactory()
	ecfg := ef.CreateDefaultConfig()
	require.NoError(t, confmap.NewFromStringMap(map[string]any{
		"endpoint":      "http://" + addr,
		"timeout":       "10s",
		"sending_queue": map[string]any{"enabled": false},
		"retry_on_failure": map[string]any{
			"enabled":          true,
			"initial_interval": "10ms",
			"max_interval":     "100ms",
			"max_elapsed_time": "2m",
		},
	}).Unmarshal(ecfg))
	require.NoError(t, confmap.Validate(ecfg))

	core, logs := observer.New(zapcore.InfoLevel)
	set := exportertest.NewNopSettings(ef.Type())
	set.Logger = zap.New(core)
	exp, err := ef.CreateTraces(ctx, set, ecfg)
	require.NoError(t, err)
	require.NoError(t, exp.Start(ctx, componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, exp.Shutdown(ctx)) })
	return exp, logs
}

// postTraces sends n spans to the receiver as a raw OTLP/HTTP protobuf
// request and returns the response with its body read.
func postTraces(t *testing.T, addr string, n int) (*http.Response, []byte) {
	t.Helper()
	body, err := ptraceotlp.NewExportRequestFromTraces(e2edata.Traces(n)).MarshalProto()
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/traces", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	respBody, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, respBody
}

const retryLogMessage = "Exporting failed. Will retry the request after interval."

func TestEndToEndRefuse(t *testing.T) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			ctx := context.Background()
			drv := d.start(t)
			p := startE2EPipeline(t, drv.host(), throttleprocessor.OnRejectRefuse)
			exp, logs := startExporter(t, p.addr)

			// Normal: straight through.
			require.NoError(t, exp.ConsumeTraces(ctx, e2edata.Traces(10)))
			require.Equal(t, 10, p.sink.SpanCount())

			drv.overload(t)

			// On the wire: 429, Retry-After in the retry_after range (whole
			// seconds, truncated), and the OTLP status with RetryInfo.
			resp, body := postTraces(t, p.addr, 3)
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "application/x-protobuf", resp.Header.Get("Content-Type"))
			retryAfter := resp.Header.Get("Retry-After")
			require.NotEmpty(t, retryAfter, "Retry-After header")
			secs, err := strconv.Atoi(retryAfter)
			require.NoError(t, err)
			minDelay, maxDelay := drv.retryRange()
			assert.GreaterOrEqual(t, time.Duration(secs)*time.Second, minDelay.Truncate(time.Second))
			assert.LessOrEqual(t, time.Duration(secs)*time.Second, maxDelay)
			var st spb.Status
			require.NoError(t, proto.Unmarshal(body, &st))
			assert.Equal(t, int32(codes.ResourceExhausted), st.GetCode())
			assert.Contains(t, st.GetMessage(), "traces refused by the throttle processor")
			require.Len(t, st.GetDetails(), 1)
			var ri errdetails.RetryInfo
			require.NoError(t, st.GetDetails()[0].UnmarshalTo(&ri))
			assert.GreaterOrEqual(t, ri.GetRetryDelay().AsDuration(), minDelay)
			assert.LessOrEqual(t, ri.GetRetryDelay().AsDuration(), maxDelay)

			// The exporter is refused, honours Retry-After and keeps retrying.
			batches := []int{5, 6, 7}
			errs := make(chan error, len(batches))
			for _, n := range batches {
				go func() { errs <- exp.ConsumeTraces(ctx, e2edata.Traces(n)) }()
			}
			require.Eventually(t, func() bool {
				return logs.FilterMessage(retryLogMessage).Len() >= len(batches)
			}, 10*time.Second, 5*time.Millisecond)
			for _, entry := range logs.FilterMessage(retryLogMessage).All() {
				msg := entry.ContextMap()["error"].(string)
				assert.Contains(t, msg, "HTTP Status Code 429")
				// NewThrottleRetry: the exporter parsed Retry-After.
				assert.Contains(t, msg, "Throttle (")
			}
			// Nothing gets through while Open.
			assert.Empty(t, errs)
			assert.Equal(t, 10, p.sink.SpanCount())

			// Recovery: every retried item arrives.
			drv.calm(t)
			for range batches {
				select {
				case err := <-errs:
					require.NoError(t, err)
				case <-time.After(30 * time.Second):
					t.Fatal("exporter did not deliver after recovery")
				}
			}
			assert.Equal(t, 10+5+6+7, p.sink.SpanCount())

			passedItems, passedBatches := outcomeTotals(t, p.tel, "passed")
			assert.Equal(t, int64(28), passedItems)
			assert.Equal(t, int64(4), passedBatches)
			refusedItems, refusedBatches := outcomeTotals(t, p.tel, "refused")
			// The raw request plus at least one refusal of each batch; the
			// exporter's retries add more.
			assert.GreaterOrEqual(t, refusedBatches, int64(1+len(batches)))
			assert.GreaterOrEqual(t, refusedItems, int64(3+5+6+7))
			droppedItems, _ := outcomeTotals(t, p.tel, "dropped")
			assert.Zero(t, droppedItems)
		})
	}
}

func TestEndToEndDrop(t *testing.T) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			ctx := context.Background()
			drv := d.start(t)
			p := startE2EPipeline(t, drv.host(), throttleprocessor.OnRejectDrop)
			exp, logs := startExporter(t, p.addr)

			require.NoError(t, exp.ConsumeTraces(ctx, e2edata.Traces(10)))

			drv.overload(t)
			// Dropped batches are answered with success: no retry.
			sentWhileOpen := 0
			for _, n := range []int{3, 4, 5} {
				require.NoError(t, exp.ConsumeTraces(ctx, e2edata.Traces(n)))
				sentWhileOpen += n
			}
			resp, _ := postTraces(t, p.addr, 2)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			sentWhileOpen += 2
			assert.Equal(t, 10, p.sink.SpanCount())

			drv.calm(t)
			require.NoError(t, exp.ConsumeTraces(ctx, e2edata.Traces(6)))
			assert.Equal(t, 16, p.sink.SpanCount())
			assert.Zero(t, logs.FilterMessage(retryLogMessage).Len())

			metadatatest.AssertEqualProcessorThrottleItems(t, p.tel,
				throttletest.ProcessorOutcomePoints(decision.SignalTraces, map[string]int64{"passed": 16, "dropped": int64(sentWhileOpen)}),
				metricdatatest.IgnoreTimestamp())
			metadatatest.AssertEqualProcessorThrottleBatches(t, p.tel,
				throttletest.ProcessorOutcomePoints(decision.SignalTraces, map[string]int64{"passed": 2, "dropped": 4}),
				metricdatatest.IgnoreTimestamp())
		})
	}
}

// outcomeTotals returns the items and batches counted with outcome.
func outcomeTotals(t *testing.T, tel *componenttest.Telemetry, outcome string) (items, batches int64) {
	t.Helper()
	return counterPoint(t, tel, "otelcol_processor_throttle_items", outcome),
		counterPoint(t, tel, "otelcol_processor_throttle_batches", outcome)
}

func counterPoint(t *testing.T, tel *componenttest.Telemetry, name, outcome string) int64 {
	t.Helper()
	m, err := tel.GetMetric(name)
	require.NoError(t, err)
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok)
	var total int64
	for _, dp := range sum.DataPoints {
		if v, ok := dp.Attributes.Value("outcome"); ok && v.AsString() == outcome {
			total += dp.Value
		}
	}
	return total
}
