// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/xprocessor"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
)

// notThrottle is an extension of another kind.
type notThrottle struct {
	component.StartFunc
	component.ShutdownFunc
}

// signalHarness creates the processor of one signal in front of a sink and
// feeds it batches of a known number of items.
type signalHarness struct {
	signal decision.Signal
	// create returns the started-able processor, a function sending one
	// batch of n items through it, and the number of items at the sink.
	create func(t *testing.T, set processor.Settings, cfg component.Config) (c component.Component, send func(ctx context.Context, n int) error, received func() int)
}

var signalHarnesses = []signalHarness{
	{
		signal: decision.SignalTraces,
		create: func(t *testing.T, set processor.Settings, cfg component.Config) (component.Component, func(context.Context, int) error, func() int) {
			sink := new(consumertest.TracesSink)
			p, err := NewFactory().CreateTraces(context.Background(), set, cfg, sink)
			require.NoError(t, err)
			return p, func(ctx context.Context, n int) error { return p.ConsumeTraces(ctx, e2edata.Traces(n)) }, sink.SpanCount
		},
	},
	{
		signal: decision.SignalMetrics,
		create: func(t *testing.T, set processor.Settings, cfg component.Config) (component.Component, func(context.Context, int) error, func() int) {
			sink := new(consumertest.MetricsSink)
			p, err := NewFactory().CreateMetrics(context.Background(), set, cfg, sink)
			require.NoError(t, err)
			return p, func(ctx context.Context, n int) error { return p.ConsumeMetrics(ctx, e2edata.Metrics(n)) }, sink.DataPointCount
		},
	},
	{
		signal: decision.SignalLogs,
		create: func(t *testing.T, set processor.Settings, cfg component.Config) (component.Component, func(context.Context, int) error, func() int) {
			sink := new(consumertest.LogsSink)
			p, err := NewFactory().CreateLogs(context.Background(), set, cfg, sink)
			require.NoError(t, err)
			return p, func(ctx context.Context, n int) error { return p.ConsumeLogs(ctx, e2edata.Logs(n)) }, sink.LogRecordCount
		},
	},
	{
		signal: decision.SignalProfiles,
		create: func(t *testing.T, set processor.Settings, cfg component.Config) (component.Component, func(context.Context, int) error, func() int) {
			sink := new(consumertest.ProfilesSink)
			p, err := NewFactory().(xprocessor.Factory).CreateProfiles(context.Background(), set, cfg, sink)
			require.NoError(t, err)
			received := func() int {
				total := 0
				for _, pd := range sink.AllProfiles() {
					total += pd.SampleCount()
				}
				return total
			}
			return p, func(ctx context.Context, n int) error { return p.ConsumeProfiles(ctx, e2edata.Profiles(n)) }, received
		},
	},
}
