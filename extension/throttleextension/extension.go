// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/extension/extensioncapabilities"
	"go.opentelemetry.io/collector/extension/extensionmiddleware"
	"google.golang.org/grpc"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// throttleExtension is the throttle extension: a shell over the runner,
// which owns the sampler, the engine and everything they drive, and hands
// decisions to the middleware and the processor.
type throttleExtension struct {
	runner *runner.Runner
}

var (
	_ extension.Extension                   = (*throttleExtension)(nil)
	_ extensionmiddleware.HTTPServer        = (*throttleExtension)(nil)
	_ extensionmiddleware.GRPCServer        = (*throttleExtension)(nil)
	_ extensioncapabilities.PipelineWatcher = (*throttleExtension)(nil)
	_ throttleapi.Throttle                  = (*throttleExtension)(nil)
)

func newExtension(cfg *Config, set extension.Settings, fo factoryOptions) (*throttleExtension, error) {
	for _, msg := range cfg.warnings() {
		set.Logger.Warn(msg)
	}
	r, err := runner.New(cfg.runnerConfig(), set.TelemetrySettings, set.ID, runner.Options{
		Source:         fo.source,
		ProcessSource:  fo.processSource,
		SetMemoryLimit: fo.memoryLimit,
		LimitsEvery:    fo.limitsEvery,
	})
	if err != nil {
		return nil, err
	}
	return &throttleExtension{runner: r}, nil
}

// Start starts the sampler. It is idempotent; with enabled: false it starts
// nothing and every decision admits.
func (e *throttleExtension) Start(ctx context.Context, host component.Host) error {
	return e.runner.Start(ctx, host)
}

// Shutdown stops the sampler and waits for it. Safe without Start, and more
// than once.
func (e *throttleExtension) Shutdown(ctx context.Context) error {
	return e.runner.Shutdown(ctx)
}

// Ready implements extensioncapabilities.PipelineWatcher.
func (e *throttleExtension) Ready() error { return nil }

// NotReady implements extensioncapabilities.PipelineWatcher: the collector
// calls it before it stops the receivers, whose servers wait for the
// requests in flight. Held requests are refused and unfinished ones cut off
// within a second, so that no client can delay the shutdown (with an
// admission budget, whose tickets are what is cut off).
func (e *throttleExtension) NotReady() error {
	e.runner.NotReady()
	return nil
}

// Decide implements throttleapi.Throttle.
func (e *throttleExtension) Decide(s decision.Signal) decision.Verdict { return e.runner.Decide(s) }

// State implements throttleapi.Throttle.
func (e *throttleExtension) State(s decision.Signal) decision.State { return e.runner.State(s) }

// RetryDelay implements throttleapi.Throttle.
func (e *throttleExtension) RetryDelay(v decision.Verdict) time.Duration {
	return e.runner.RetryDelay(v)
}

// ObserveOnly implements throttleapi.Throttle.
func (e *throttleExtension) ObserveOnly() bool { return e.runner.ObserveOnly() }

// RecordProcessorDecision implements throttleapi.Throttle.
func (e *throttleExtension) RecordProcessorDecision(s decision.Signal, v decision.Verdict) {
	e.runner.RecordProcessorDecision(s, v)
}

// GetHTTPHandler implements extensionmiddleware.HTTPServer: the receiver's
// handler is wrapped so that requests are decided before their body is read.
func (e *throttleExtension) GetHTTPHandler(context.Context) (extensionmiddleware.WrapHTTPHandlerFunc, error) {
	return func(_ context.Context, next http.Handler) (http.Handler, error) {
		m, err := middleware.NewHTTP(e.runner.MiddlewareConfig())
		if err != nil {
			return nil, err
		}
		return m.Wrap(next), nil
	}, nil
}

// GetGRPCServerOptions implements extensionmiddleware.GRPCServer: a tap
// handle decides when a stream's headers arrive, before any message is read.
// grpc-go allows one tap handle per server.
func (e *throttleExtension) GetGRPCServerOptions(context.Context) ([]grpc.ServerOption, error) {
	m, err := middleware.NewGRPC(e.runner.MiddlewareConfig())
	if err != nil {
		return nil, err
	}
	return m.ServerOptions(), nil
}
