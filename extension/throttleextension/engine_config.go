// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"time"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// runnerConfig maps the configuration to the runner's: every section
// resolved into what the sampler, the engine, the middleware and the status
// page take.
func (cfg *Config) runnerConfig() runner.Config {
	rc := runner.Config{
		Enabled:           cfg.Enabled,
		ObserveOnly:       cfg.ObserveOnly,
		Sampler:           cfg.samplerConfig(),
		Decision:          cfg.decisionConfig(),
		Routes:            cfg.middlewareRoutes(),
		RetryAfterMin:     cfg.RetryAfter.Min,
		RetryAfterMax:     cfg.RetryAfter.Max,
		TarpitDelay:       cfg.Tarpit.Delay,
		TarpitMaxRequests: cfg.Tarpit.MaxRequests,
		Hold:              cfg.Hold,
		Admission:         cfg.Admission,
		GoMemLimit:        cfg.Memory.SoftLimit.ownerConfig(),
		StaleAfter:        cfg.StaleAfter,
		ReportStatus:      cfg.ReportStatus,
		Effective:         cfg,
	}
	if cfg.Status.HasValue() {
		status := *cfg.Status.Get() // ToServer fills in defaults; keep the config as loaded
		rc.Status = &status
	}
	return rc
}

// samplerConfig maps check_interval and how CPU and memory are measured
// to the sampler's configuration. The slow cadence at which limits are
// re-read is left to the sampler's default: it is not a user setting.
func (cfg *Config) samplerConfig() sampler.Config {
	return sampler.Config{
		Interval:      cfg.CheckInterval,
		CPUFastWindow: cfg.CPU.FastWindow,
		CPUSlowWindow: cfg.CPU.SlowWindow,
		FallbackCores: cfg.CPU.FallbackCores,
		// Validate bounds limit_mib so the shift cannot overflow.
		MemoryLimit: cfg.Memory.LimitMiB << 20,
	}
}

// decisionConfig maps the lines of the cpu and memory sections, the rules
// and recovery_ramp to the decision engine's configuration, with every
// signal's rule resolved over the default rule and every breach_duration
// counted in checks.
func (cfg *Config) decisionConfig() decision.Config {
	ci := cfg.CheckInterval
	dc := decision.Config{
		CPU: decision.Slot{
			Enabled: cfg.CPU.Enabled, Enter: cfg.CPU.Enter, Exit: cfg.CPU.Exit, Hard: cfg.CPU.Hard,
			BreachN: breachChecks(cfg.CPU.BreachDuration, ci), MaxShed: cfg.CPU.MaxShed,
		},
		Mem: decision.Slot{
			Enabled: cfg.Memory.Enabled, Enter: cfg.Memory.Enter, Exit: cfg.Memory.Exit, Hard: cfg.Memory.Hard,
			BreachN: breachChecks(cfg.Memory.BreachDuration, ci), MaxShed: cfg.Memory.MaxShed,
		},
		RecoveryRamp: cfg.RecoveryRamp,
		Interval:     ci,
	}
	for s := range decision.NumSignals {
		dc.Rules[s] = cfg.ruleFor(s)
	}
	return dc
}

// breachChecks is how many consecutive checks make a breach of d at a
// check interval of ci: d rounded up to whole checks, at least one.
func breachChecks(d, ci time.Duration) int {
	if d <= 0 || ci <= 0 {
		return 1
	}
	return int(max(1, (d+ci-1)/ci))
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
