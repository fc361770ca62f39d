// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
)

// runnerConfig is the runner's configuration: the sections the runner's
// parts own, as they are, and the request path's sections resolved into
// what the middleware takes.
func (cfg *Config) runnerConfig() runner.Config {
	rc := runner.Config{
		Settings:          cfg.Settings,
		CPU:               cfg.CPU,
		Memory:            cfg.Memory,
		Rules:             cfg.Rules,
		Routes:            cfg.middlewareRoutes(),
		RetryAfterMin:     cfg.RetryAfter.Min,
		RetryAfterMax:     cfg.RetryAfter.Max,
		TarpitDelay:       cfg.Tarpit.Delay,
		TarpitMaxRequests: cfg.Tarpit.MaxRequests,
		Hold:              cfg.Hold,
		Admission:         cfg.Admission,
		Effective:         cfg,
	}
	if cfg.Status.HasValue() {
		status := *cfg.Status.Get() // ToServer fills in defaults; keep the config as loaded
		rc.Status = &status
	}
	return rc
}

// middlewareRoutes maps the routes section to the middleware's routes.
// Validate has checked every signal name, so unknown names cannot occur.
func (cfg *Config) middlewareRoutes() middleware.Routes {
	r := middleware.Routes{
		HTTP: make(map[string]decision.Signal, len(cfg.Routes.HTTP)),
		GRPC: make(map[string]decision.Signal, len(cfg.Routes.GRPC)),
	}
	for p, name := range cfg.Routes.HTTP {
		if s, ok := decision.ParseSignal(name); ok {
			r.HTTP[p] = s
		}
	}
	for m, name := range cfg.Routes.GRPC {
		if s, ok := decision.ParseSignal(name); ok {
			r.GRPC[m] = s
		}
	}
	return r
}
