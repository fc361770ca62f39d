// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor // import "github.com/otelthrottle/throttle"

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"go.opentelemetry.io/collector/processor"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/metadata"
)

// processorKey is the attribute naming the processor instance on every series,
// as core processors do (go.opentelemetry.io/collector/processor/internal).
const processorKey = "processor"

// outcome is what happened to a batch in the processor.
type outcome uint8

const (
	outcomePassed outcome = iota
	outcomeRefused
	outcomeDropped
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"passed", "refused", "dropped"}

// obsReport counts the items and batches of one processor instance (one
// signal) per outcome.
type obsReport struct {
	telemetryBuilder *metadata.TelemetryBuilder
	// opts holds one pre-built option slice per outcome: the attribute set
	// (processor, signal, outcome) is computed once here so that counting on
	// the request path neither builds a set nor allocates the variadic slice.
	opts [numOutcomes][]metric.AddOption
}

func newObsReport(set processor.Settings, sig decision.Signal) (*obsReport, error) {
	tb, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, err
	}
	or := &obsReport{telemetryBuilder: tb}
	for o := range numOutcomes {
		attrs := attribute.NewSet(
			attribute.String(processorKey, set.ID.String()),
			attribute.String("signal", sig.String()),
			attribute.String("outcome", outcomeNames[o]),
		)
		or.opts[o] = []metric.AddOption{metric.WithAttributeSet(attrs)}
	}
	return or, nil
}

// record counts one batch of items with outcome o.
func (or *obsReport) record(ctx context.Context, o outcome, items int) {
	or.telemetryBuilder.ProcessorThrottleBatches.Add(ctx, 1, or.opts[o]...)
	or.telemetryBuilder.ProcessorThrottleItems.Add(ctx, int64(items), or.opts[o]...)
}

func (or *obsReport) shutdown() {
	or.telemetryBuilder.Shutdown()
}
