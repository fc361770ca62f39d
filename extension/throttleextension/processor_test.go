// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/collector/processor/xprocessor"
	"google.golang.org/grpc/codes"

	throttleprocessor "github.com/otelthrottle/throttle"
	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/middleware"
)

// The throttle processor (repository root) against the real extension,
// whose level the tests drive through its source. The processor's own
// behaviour is tested against a stand-in of the interface it consumes in
// its package.

// startProcessor starts the throttle processor of signal s, following the
// extension ext, in front of a sink. It returns a function sending one
// batch of n items through it and the number of items at the sink. It is
// shut down when the test ends.
func startProcessor(t *testing.T, s decision.Signal, ext component.Component) (send func(n int) error, received func() int) {
	t.Helper()
	ctx := context.Background()
	f := throttleprocessor.NewFactory()
	set := processortest.NewNopSettings(f.Type())
	cfg := f.CreateDefaultConfig()
	var c component.Component
	switch s {
	case decision.SignalTraces:
		sink := new(consumertest.TracesSink)
		p, err := f.CreateTraces(ctx, set, cfg, sink)
		require.NoError(t, err)
		c, send, received = p, func(n int) error { return p.ConsumeTraces(ctx, e2edata.Traces(n)) }, sink.SpanCount
	case decision.SignalMetrics:
		sink := new(consumertest.MetricsSink)
		p, err := f.CreateMetrics(ctx, set, cfg, sink)
		require.NoError(t, err)
		c, send, received = p, func(n int) error { return p.ConsumeMetrics(ctx, e2edata.Metrics(n)) }, sink.DataPointCount
	case decision.SignalLogs:
		sink := new(consumertest.LogsSink)
		p, err := f.CreateLogs(ctx, set, cfg, sink)
		require.NoError(t, err)
		c, send, received = p, func(n int) error { return p.ConsumeLogs(ctx, e2edata.Logs(n)) }, sink.LogRecordCount
	case decision.SignalProfiles:
		sink := new(consumertest.ProfilesSink)
		p, err := f.(xprocessor.Factory).CreateProfiles(ctx, set, cfg, sink)
		require.NoError(t, err)
		c, send, received = p, func(n int) error { return p.ConsumeProfiles(ctx, e2edata.Profiles(n)) }, sink.SampleCount
	}
	require.NoError(t, c.Start(ctx, e2eHost{exts: map[component.ID]component.Component{component.MustNewID("throttle"): ext}}))
	t.Cleanup(func() { require.NoError(t, c.Shutdown(ctx)) })
	return send, received
}

// processorTestConfig is testConfig with every signal throttled, no CPU
// lines and retry hints of 1s to 2s.
func processorTestConfig(t *testing.T, mutate ...func(*Config)) *Config {
	return testConfig(t, append([]func(*Config){func(c *Config) {
		c.CPU.Enabled = false
		c.Rules = decision.DefaultRulesConfig()
		c.RetryAfter = middleware.RetryConfig{Min: time.Second, Max: 2 * time.Second}
	}}, mutate...)...)
}

// TestProcessorWithThrottleExtension: every signal's processor refuses in
// Open with a retry hint from the extension's retry_after range, lets
// everything through in Normal, and its decisions are counted in the
// extension's throttle_requests with protocol=processor.
func TestProcessorWithThrottleExtension(t *testing.T) {
	for _, sig := range allSignals {
		t.Run(sig.String(), func(t *testing.T) {
			tel := componenttest.NewTelemetry()
			t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
			src := newFakeSource(10)
			e := startTestExtension(t, src, processorTestConfig(t), metadatatest.NewSettings(tel))
			send, received := startProcessor(t, sig, e)

			require.NoError(t, send(4))
			assert.Equal(t, 4, received())

			src.SetMemoryShare(0.95) // over the hard line
			waitState(t, e, decision.StateOpen)
			err := send(5)
			code, delay := e2edata.RetryInfo(t, err)
			assert.Equal(t, codes.ResourceExhausted, code)
			assert.GreaterOrEqual(t, delay, time.Second)
			assert.LessOrEqual(t, delay, 2*time.Second)
			assert.Contains(t, err.Error(), "(open)")
			assert.Equal(t, 4, received())

			src.SetMemoryShare(0.1)
			waitState(t, e, decision.StateNormal)
			require.NoError(t, send(6))
			assert.Equal(t, 10, received())

			assert.Equal(t, int64(2), e2edata.Requests(t, tel, "processor", sig.String(), "allowed", ""))
			assert.Equal(t, int64(1), e2edata.Requests(t, tel, "processor", sig.String(), "denied", "open"))
		})
	}
}

// TestProcessorFollowsItsSignalRule: each processor asks for its own signal,
// so a signal exempted by its rule passes while another one is refused
// (Shedding with drop_min 1; an exempt signal is refused only at the memory
// backstop, the hard line).
func TestProcessorFollowsItsSignalRule(t *testing.T) {
	src := newFakeSource(10)
	e := startTestExtension(t, src, processorTestConfig(t, func(c *Config) {
		one, off := 1.0, false
		c.Rules[decision.RuleKeyDefault] = decision.RuleConfig{DropMin: &one}
		c.Rules["metrics"] = decision.RuleConfig{Enabled: &off}
	}), nopSettings())
	sendTraces, tracesReceived := startProcessor(t, decision.SignalTraces, e)
	sendMetrics, metricsReceived := startProcessor(t, decision.SignalMetrics, e)

	src.SetMemoryShare(0.88) // between the enter and hard lines
	waitState(t, e, decision.StateShedding)
	code, _ := e2edata.RetryInfo(t, sendTraces(3))
	assert.Equal(t, codes.ResourceExhausted, code)
	require.NoError(t, sendMetrics(3))
	assert.Equal(t, 0, tracesReceived())
	assert.Equal(t, 3, metricsReceived())
}
