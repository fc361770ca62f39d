// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/xprocessor"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// testHost is a component.Host holding the given extensions.
type testHost struct {
	extensions map[component.ID]component.Component
}

func (h testHost) GetExtensions() map[component.ID]component.Component { return h.extensions }

func hostWith(id component.ID, ext component.Component) component.Host {
	return testHost{extensions: map[component.ID]component.Component{id: ext}}
}

// fakeThrottle is a throttle extension whose verdicts the test sets. It
// records every call the processor makes.
type fakeThrottle struct {
	component.StartFunc
	component.ShutdownFunc

	verdicts [decision.NumSignals]atomic.Uint32
	delay    time.Duration
	decides  [decision.NumSignals]atomic.Int64
	observe  atomic.Bool

	mu       sync.Mutex
	recorded []recordedDecision
}

type recordedDecision struct {
	signal  decision.Signal
	verdict decision.Verdict
}

var _ throttleapi.Throttle = (*fakeThrottle)(nil)

func newFakeThrottle(delay time.Duration) *fakeThrottle {
	return &fakeThrottle{delay: delay}
}

func (f *fakeThrottle) set(s decision.Signal, v decision.Verdict) {
	f.verdicts[s].Store(uint32(v))
}

func (f *fakeThrottle) Decide(s decision.Signal) decision.Verdict {
	f.decides[s].Add(1)
	return decision.Verdict(f.verdicts[s].Load())
}

func (f *fakeThrottle) RetryDelay(decision.Verdict) time.Duration { return f.delay }

func (f *fakeThrottle) State(s decision.Signal) decision.State {
	if decision.Verdict(f.verdicts[s].Load()) == decision.DenyOpen {
		return decision.Open
	}
	return decision.Normal
}

func (f *fakeThrottle) ObserveOnly() bool { return f.observe.Load() }

func (f *fakeThrottle) RecordProcessorDecision(s decision.Signal, v decision.Verdict) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recorded = append(f.recorded, recordedDecision{s, v})
}

func (f *fakeThrottle) recordedDecisions() []recordedDecision {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recordedDecision(nil), f.recorded...)
}

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
		signal: decision.Traces,
		create: func(t *testing.T, set processor.Settings, cfg component.Config) (component.Component, func(context.Context, int) error, func() int) {
			sink := new(consumertest.TracesSink)
			p, err := NewFactory().CreateTraces(context.Background(), set, cfg, sink)
			require.NoError(t, err)
			return p, func(ctx context.Context, n int) error { return p.ConsumeTraces(ctx, e2edata.Traces(n)) }, sink.SpanCount
		},
	},
	{
		signal: decision.Metrics,
		create: func(t *testing.T, set processor.Settings, cfg component.Config) (component.Component, func(context.Context, int) error, func() int) {
			sink := new(consumertest.MetricsSink)
			p, err := NewFactory().CreateMetrics(context.Background(), set, cfg, sink)
			require.NoError(t, err)
			return p, func(ctx context.Context, n int) error { return p.ConsumeMetrics(ctx, e2edata.Metrics(n)) }, sink.DataPointCount
		},
	},
	{
		signal: decision.Logs,
		create: func(t *testing.T, set processor.Settings, cfg component.Config) (component.Component, func(context.Context, int) error, func() int) {
			sink := new(consumertest.LogsSink)
			p, err := NewFactory().CreateLogs(context.Background(), set, cfg, sink)
			require.NoError(t, err)
			return p, func(ctx context.Context, n int) error { return p.ConsumeLogs(ctx, e2edata.Logs(n)) }, sink.LogRecordCount
		},
	},
	{
		signal: decision.Profiles,
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
