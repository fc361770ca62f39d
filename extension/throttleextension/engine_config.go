// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"
)

// runnerConfig is the runner's configuration: the sections the runner's
// parts own, as they are, and the request path's sections resolved into
// what the middleware takes.
func (cfg *Config) runnerConfig() runner.Config {
	rc := runner.Config{
		Settings:   cfg.Settings,
		CPU:        cfg.CPU,
		Memory:     cfg.Memory,
		Downstream: cfg.Downstream,
		Rules:      cfg.Rules,
		Routes:     cfg.Routes,
		RetryAfter: cfg.RetryAfter,
		Tarpit:     cfg.Tarpit,
		Hold:       cfg.Hold,
		Admission:  cfg.Admission,
		Effective:  cfg,
	}
	if cfg.Status.HasValue() {
		status := *cfg.Status.Get() // ToServer fills in defaults; keep the config as loaded
		rc.Status = &status
	}
	return rc
}
