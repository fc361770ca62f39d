// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package exporters

// End-to-end tests of the throttle processor (repository root) with a real
// otlphttpexporter as the client: otlpreceiver -> processor -> sink, the
// processor following the real extension, whose water level the tests drive
// through its resource source (the processor's own tests use a stand-in).

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
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	throttleprocessor "github.com/otelthrottle/throttle"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// The memory levels the extension's source is set to, against the default
// memory lines (enter 0.85, hard 0.92), and the retry_after range of the
// tests: short, so that clients retry soon, and at least one second so that
// Retry-After (whole seconds) is not 0.
const (
	calmLevel       = 0.10 // under every memory line
	overloadedLevel = 0.95 // over hard: Open in one check
	minRetry        = time.Second
	maxRetry        = 2 * time.Second
)

// throttleDriver is a started throttle extension whose water level the test
// drives through its source.
type throttleDriver struct {
	ext component.Component
	th  throttleapi.Throttle
	src *testutil.Source
}

// startDriver starts the throttle extension at calmLevel, with a 10ms check
// interval, no CPU lines, no recovery ramp and retry_after [minRetry,
// maxRetry].
func startDriver(t *testing.T) *throttleDriver {
	src := testutil.NewSource(cgroup.Limits{MemLimit: 1000})
	src.SetMemoryShare(calmLevel)
	ext, th := startThrottle(t, src, map[string]any{
		"check_interval": "10ms",
		"recovery_ramp":  "0s",
		// A sampler starved under -race must not turn Open into Normal.
		"stale_after": "0s",
		"retry_after": map[string]any{"min": minRetry.String(), "max": maxRetry.String()},
		"cpu":         map[string]any{"enabled": false},
	}, nil)
	d := &throttleDriver{ext: ext, th: th, src: src}
	d.calm(t)
	return d
}

func (d *throttleDriver) host() component.Host { return hostWith(defaultExtensionID, d.ext) }

func (d *throttleDriver) setLevel(tb testing.TB, level float64, want decision.State) {
	d.src.SetMemoryShare(level)
	waitState(tb, d.th, want, 10*time.Second)
}

func (d *throttleDriver) overload(tb testing.TB) { d.setLevel(tb, overloadedLevel, decision.StateOpen) }

func (d *throttleDriver) calm(tb testing.TB) { d.setLevel(tb, calmLevel, decision.StateNormal) }

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
	ctx := context.Background()
	drv := startDriver(t)
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
	minDelay, maxDelay := minRetry, maxRetry
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
}

func TestEndToEndDrop(t *testing.T) {
	ctx := context.Background()
	drv := startDriver(t)
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

	passedItems, passedBatches := outcomeTotals(t, p.tel, "passed")
	assert.Equal(t, []int64{16, 2}, []int64{passedItems, passedBatches})
	droppedItems, droppedBatches := outcomeTotals(t, p.tel, "dropped")
	assert.Equal(t, []int64{int64(sentWhileOpen), 4}, []int64{droppedItems, droppedBatches})
	refusedItems, refusedBatches := outcomeTotals(t, p.tel, "refused")
	assert.Zero(t, refusedItems+refusedBatches, "dropped, not refused")
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
