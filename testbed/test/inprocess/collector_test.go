// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package inprocess runs a whole collector in the test process: otelcol's
// own Collector with the real otlpreceiver, the throttle extension on both of
// its protocols and the throttle processor in a pipeline, exactly as a
// distribution wires them, but without ocb, so it is fast and runs with -race.
package inprocess

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/nopexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	throttleprocessor "github.com/otelthrottle/throttle"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/testbed/test/internal/e2e"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const memLimit = 100 << 20 // the fake source's memory limit: 100 MiB

// newFakeSource is the resource source of the extension under test: no CPU
// used, one CPU, a memory limit of memLimit and a working set at share of it.
func newFakeSource(share float64) *testutil.Source {
	src := testutil.NewSource(cgroup.Limits{MemLimit: memLimit, CPUSetCores: 1})
	src.SetMemoryShare(share)
	return src
}

func factories(src *testutil.Source) func() (otelcol.Factories, error) {
	return func() (otelcol.Factories, error) {
		var f otelcol.Factories
		var err error
		if f.Extensions, err = otelcol.MakeFactoryMap(e2e.ExtensionFactory(src)); err != nil {
			return f, err
		}
		if f.Receivers, err = otelcol.MakeFactoryMap(otlpreceiver.NewFactory()); err != nil {
			return f, err
		}
		if f.Processors, err = otelcol.MakeFactoryMap(throttleprocessor.NewFactory()); err != nil {
			return f, err
		}
		if f.Exporters, err = otelcol.MakeFactoryMap(debugexporter.NewFactory(), nopexporter.NewFactory()); err != nil {
			return f, err
		}
		return f, nil
	}
}

// TestCollectorInProcess: admitted in Normal over OTLP/HTTP and gRPC, through
// the pipeline to the exporter; rejected at the receivers' entrance in Open
// (429 + Retry-After, RESOURCE_EXHAUSTED + RetryInfo); admitted again after
// recovery; every decision counted on the collector's metrics endpoint; a
// clean shutdown with no goroutine left.
func TestCollectorInProcess(t *testing.T) {
	src := newFakeSource(0.10)
	ports := e2e.FreePorts(t)
	col := e2e.StartCollector(t, factories(src), e2e.Render(t, filepath.Join("testdata", "config.yaml.tmpl"), ports))
	observed := col.Logs
	defer http.DefaultClient.CloseIdleConnections()

	httpAddr := fmt.Sprintf("127.0.0.1:%d", ports.HTTPPort)
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", ports.GRPCPort)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, err := e2e.DialGRPC(grpcAddr)
	require.NoError(t, err)
	defer client.Close()

	// Normal: both protocols admit, and the spans reach the debug exporter
	// through the throttle processor.
	code, body, err := e2e.PostTraces(ctx, httpAddr, e2e.Traces(3))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "POST /v1/traces in Normal: %s", body)
	_, err = client.ExportTraces(ctx, e2e.Traces(5))
	require.NoError(t, err, "gRPC traces in Normal")
	_, err = client.ExportLogs(ctx, e2e.Logs(2))
	require.NoError(t, err, "gRPC logs in Normal")
	require.Eventually(t, func() bool { return exportedSpans(observed) == 8 }, 10*time.Second, 10*time.Millisecond,
		"want 8 spans through the debug exporter, got %d", exportedSpans(observed))

	// Open: memory over the hard line (0.92); one sample is enough
	// (one check breaches). Requests are refused at the entrance.
	src.SetMemoryShare(0.97)
	require.Eventually(t, func() bool {
		code, _, err := e2e.PostTraces(ctx, httpAddr, e2e.Traces(1))
		return err == nil && code == http.StatusTooManyRequests
	}, 10*time.Second, 20*time.Millisecond, "HTTP never answered 429 with memory at 97%")
	// Requests sent before the sample that moved the state were admitted;
	// from here on nothing may reach the exporter.
	spansInOpen := exportedSpans(observed)

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/v1/traces", http.NoBody)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "2", resp.Header.Get("Retry-After"), "retry_after is fixed at 2s in the config")

	// gRPC in Open: the call waits for a decision that admits it, within
	// its deadline (most of it), and is refused when that is over: with
	// RESOURCE_EXHAUSTED + RetryInfo, or CANCELLED if its message had not
	// arrived yet; the OTLP exporters retry both.
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err = client.ExportTraces(short, e2e.Traces(1))
	cancelShort()
	require.Error(t, err, "gRPC must be refused in Open")
	st := status.Convert(err)
	if st.Code() != codes.Canceled {
		assert.Equal(t, codes.ResourceExhausted, st.Code(), "gRPC status: %v", st)
		var retry *errdetails.RetryInfo
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				retry = ri
			}
		}
		if assert.NotNil(t, retry, "RESOURCE_EXHAUSTED without RetryInfo: OTLP exporters would not retry") {
			assert.Equal(t, 2*time.Second, retry.GetRetryDelay().AsDuration())
		}
	}
	assert.Equal(t, spansInOpen, exportedSpans(observed), "nothing refused may reach the exporter")

	// A call that arrives in Open and is still waiting when the Open ends
	// goes in.
	heldErr := make(chan error, 1)
	go func() {
		_, err := client.ExportTraces(ctx, e2e.Traces(1))
		heldErr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, spansInOpen, exportedSpans(observed), "nothing goes in while Open")

	// Recovery: below exit (0.78), recovery_ramp 0s.
	src.SetMemoryShare(0.10)
	require.NoError(t, <-heldErr, "the call held through the Open")
	require.Eventually(t, func() bool {
		code, _, err := e2e.PostTraces(ctx, httpAddr, e2e.Traces(1))
		return err == nil && code == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond, "HTTP never admitted again after memory fell to 10%")
	_, err = client.ExportTraces(ctx, e2e.Traces(1))
	require.NoError(t, err, "gRPC after recovery")

	// Every decision counted in the extension's and the processor's metrics.
	wants := []struct {
		name   string
		labels map[string]string
		least  float64
	}{
		{"otelcol_throttle_requests", map[string]string{"protocol": "http", "decision": "allowed"}, 2},
		{"otelcol_throttle_requests", map[string]string{"protocol": "grpc", "decision": "allowed"}, 3},
		{"otelcol_throttle_requests", map[string]string{"protocol": "http", "decision": "denied", "reason": "open"}, 2},
		{"otelcol_throttle_requests", map[string]string{"protocol": "grpc", "decision": "denied", "reason": "open"}, 1},
		{"otelcol_processor_throttle_items", map[string]string{"signal": "traces", "outcome": "passed"}, 8},
		{"otelcol_throttle_state", map[string]string{"signal": "traces"}, 0},
	}
	// The description is made inside: a message argument would be made
	// before the first collection, and show nothing.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		samples := col.Samples(t)
		for _, w := range wants {
			assert.Truef(c, metricAtLeast(samples, w.name, w.labels, w.least), "%s %v >= %v; throttle metrics:\n%s%s",
				w.name, w.labels, w.least, e2e.Describe(samples, "otelcol_throttle_"), e2e.Describe(samples, "otelcol_processor_throttle_"))
		}
	}, 30*time.Second, 50*time.Millisecond)

	client.Close()
	col.Stop(t)
	assert.Equal(t, otelcol.StateClosed, col.State())
}

// exportedSpans adds up the "spans" field of the debug exporter's log lines.
func exportedSpans(observed *observer.ObservedLogs) int {
	n := 0
	for _, e := range observed.FilterMessage("Traces").All() {
		if v, ok := e.ContextMap()["spans"]; ok {
			switch x := v.(type) {
			case int64:
				n += int(x)
			case int:
				n += x
			default:
				if i, err := strconv.Atoi(fmt.Sprint(x)); err == nil {
					n += i
				}
			}
		}
	}
	return n
}

func metricAtLeast(samples []e2e.Sample, name string, labels map[string]string, least float64) bool {
	v, ok := e2e.Sum(samples, name, labels)
	return ok && v >= least
}
