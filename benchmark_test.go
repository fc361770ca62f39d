// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper"
	"go.opentelemetry.io/collector/processor/processortest"

	"github.com/otelthrottle/throttle/extension/throttleextension"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/metadata"
	"github.com/otelthrottle/throttle/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// admitThrottle admits everything and records nothing: it isolates the
// processor's own cost from the extension's.
type admitThrottle struct {
	component.StartFunc
	component.ShutdownFunc
}

func (admitThrottle) Decide(decision.Signal) decision.Verdict {
	return decision.VerdictAdmit
}
func (admitThrottle) RetryDelay(decision.Verdict) time.Duration { return 0 }
func (admitThrottle) State(decision.Signal) decision.State {
	return decision.StateNormal
}
func (admitThrottle) RecordProcessorDecision(decision.Signal, decision.Verdict) {}
func (admitThrottle) ObserveOnly() bool                                         { return false }

var _ throttleapi.Throttle = admitThrottle{}

// BenchmarkProcessor measures the per-batch cost of the processor in Normal
// (every batch admitted) on a batch of 100 spans, against "bare": the same
// processorhelper with a process function that does nothing, so that the
// difference is the throttle processor's own overhead (one Decide, one
// RecordProcessorDecision, counting spans and two counter increments).
// "nop_consumer" is the next consumer alone, for scale.
//
//	go test -run='^$' -bench=Processor -benchmem .
func BenchmarkProcessor(b *testing.B) {
	td := e2edata.Traces(100)
	telemetries := []struct {
		name string
		set  func(b *testing.B) processor.Settings
	}{
		{"nop_telemetry", func(*testing.B) processor.Settings {
			return processortest.NewNopSettings(metadata.Type)
		}},
		{"sdk_telemetry", func(b *testing.B) processor.Settings {
			tel := componenttest.NewTelemetry()
			b.Cleanup(func() { require.NoError(b, tel.Shutdown(context.Background())) })
			return metadatatest.NewSettings(tel)
		}},
	}
	b.Run("nop_consumer", func(b *testing.B) {
		runTracesBenchmark(b, consumertest.NewNop(), td)
	})
	for _, tl := range telemetries {
		b.Run(tl.name+"/bare", func(b *testing.B) {
			p, err := processorhelper.NewTraces(context.Background(), tl.set(b), createDefaultConfig(), consumertest.NewNop(),
				func(_ context.Context, td ptrace.Traces) (ptrace.Traces, error) { return td, nil })
			require.NoError(b, err)
			runTracesBenchmark(b, p, td)
		})
		b.Run(tl.name+"/throttle_admit_fake", func(b *testing.B) {
			p := startBenchProcessor(b, tl.set(b), hostWith(defaultExtensionID, admitThrottle{}))
			runTracesBenchmark(b, p, td)
		})
		b.Run(tl.name+"/throttle_extension", func(b *testing.B) {
			p := startBenchProcessor(b, tl.set(b), hostWith(defaultExtensionID, startNormalExtension(b)))
			runTracesBenchmark(b, p, td)
		})
	}
}

// startNormalExtension starts a real throttle extension, built by its own
// factory, that stays Normal whatever the machine does: CPU and memory are
// not held to their lines, and the Go runtime's soft memory limit and GC
// percent are left alone. It is shut down when the benchmark ends.
func startNormalExtension(b *testing.B) component.Component {
	ctx := context.Background()
	f := throttleextension.NewFactory()
	cfg := f.CreateDefaultConfig()
	require.NoError(b, confmap.NewFromStringMap(map[string]any{
		"cpu":    map[string]any{"enabled": false},
		"memory": map[string]any{"enabled": false, "soft_limit": map[string]any{"enabled": false, "heap_target": 0}},
	}).Unmarshal(cfg))
	ext, err := f.Create(ctx, extensiontest.NewNopSettings(f.Type()), cfg)
	require.NoError(b, err)
	require.NoError(b, ext.Start(ctx, componenttest.NewNopHost()))
	b.Cleanup(func() { require.NoError(b, ext.Shutdown(ctx)) })
	return ext
}

func startBenchProcessor(b *testing.B, set processor.Settings, host component.Host) processor.Traces {
	p, err := NewFactory().CreateTraces(context.Background(), set, createDefaultConfig(), consumertest.NewNop())
	require.NoError(b, err)
	require.NoError(b, p.Start(context.Background(), host))
	b.Cleanup(func() { require.NoError(b, p.Shutdown(context.Background())) })
	return p
}

func runTracesBenchmark(b *testing.B, c consumer.Traces, td ptrace.Traces) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := c.ConsumeTraces(ctx, td); err != nil {
			b.Fatal(err)
		}
	}
}
