// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor // import "github.com/otelthrottle/throttle"

import (
	"context"
	"fmt"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// throttleProcessor applies the decisions of a throttle extension to the
// batches of one signal. It holds no state of its own besides the
// extension found at Start.
type throttleProcessor struct {
	cfg    *Config
	signal decision.Signal
	obsrep *obsReport

	// throttle is set once by start, before the pipeline consumes anything.
	throttle throttleapi.Throttle
}

func newThrottleProcessor(set processor.Settings, cfg *Config, sig decision.Signal) (*throttleProcessor, error) {
	obsrep, err := newObsReport(set, sig)
	if err != nil {
		return nil, err
	}
	return &throttleProcessor{cfg: cfg, signal: sig, obsrep: obsrep}, nil
}

func (p *throttleProcessor) start(_ context.Context, host component.Host) error {
	t, err := findThrottle(host, p.cfg.Extension)
	if err != nil {
		return err
	}
	p.throttle = t
	return nil
}

// findThrottle looks the throttle extension id up among the host's
// extensions. Both failures are configuration errors, so they say what to fix.
func findThrottle(host component.Host, id component.ID) (throttleapi.Throttle, error) {
	ext, ok := host.GetExtensions()[id]
	if !ok {
		return nil, fmt.Errorf("throttle processor: extension %q not found; add it under extensions: and list it in service.extensions",
			id.String())
	}
	t, ok := ext.(throttleapi.Throttle)
	if !ok {
		return nil, fmt.Errorf("throttle processor: extension %q is a %T, not a throttle extension; set the processor's extension: to the ID of a throttle extension",
			id.String(), ext)
	}
	return t, nil
}

func (p *throttleProcessor) shutdown(context.Context) error {
	p.obsrep.shutdown()
	return nil
}

// admit asks the throttle once for this batch of items, counts the outcome,
// and returns nil when the batch goes on.
func (p *throttleProcessor) admit(ctx context.Context, items int) error {
	v := p.throttle.Decide(p.signal)
	p.throttle.RecordProcessorDecision(p.signal, v)
	if v.Admitted() || p.throttle.ObserveOnly() {
		p.obsrep.record(ctx, outcomePassed, items)
		return nil
	}
	if p.cfg.OnReject == OnRejectDrop {
		p.obsrep.record(ctx, outcomeDropped, items)
		// processorhelper turns the sentinel into a nil error upstream.
		return processorhelper.ErrSkipProcessingData
	}
	p.obsrep.record(ctx, outcomeRefused, items)
	return p.refusal(v)
}

// refusal is the error returned upstream for a refused batch: the
// middleware's retryable status error. otlpreceiver passes it on as is over
// gRPC and turns it into 429 + Retry-After over HTTP. The status error is
// not permanent, and status.FromError finds it through wrappers
// (consumererror.NewDownstream in the service's pipeline instrumentation).
func (p *throttleProcessor) refusal(v decision.Verdict) error {
	delay := p.throttle.RetryDelay(v)
	return middleware.RetryableError(
		fmt.Sprintf("%s refused by the throttle processor: signal is overloaded (%s); retry after %s",
			p.signal, v.Reason(), delay), delay)
}

func (p *throttleProcessor) processTraces(ctx context.Context, td ptrace.Traces) (ptrace.Traces, error) {
	return td, p.admit(ctx, td.SpanCount())
}

func (p *throttleProcessor) processMetrics(ctx context.Context, md pmetric.Metrics) (pmetric.Metrics, error) {
	return md, p.admit(ctx, md.DataPointCount())
}

func (p *throttleProcessor) processLogs(ctx context.Context, ld plog.Logs) (plog.Logs, error) {
	return ld, p.admit(ctx, ld.LogRecordCount())
}

func (p *throttleProcessor) processProfiles(ctx context.Context, pd pprofile.Profiles) (pprofile.Profiles, error) {
	return pd, p.admit(ctx, pd.SampleCount())
}
