// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
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
		Enabled:       cfg.Enabled,
		ObserveOnly:   cfg.ObserveOnly,
		Sampler:       cfg.samplerConfig(),
		Decision:      cfg.decisionConfig(),
		Routes:        cfg.middlewareRoutes(),
		RetryAfterMin: cfg.RetryAfter.Min,
		RetryAfterMax: cfg.RetryAfter.Max,
		PacingDelay:   cfg.Pacing.Delay,
		PacingMaxHeld: cfg.Pacing.MaxHeld,
		QueueMaxWait:  cfg.Queue.MaxWait,
		QueueMaxHeld:  cfg.Queue.MaxHeld,
		Admission: runner.Admission{
			AutoBudget:  cfg.Admission.MaxInflightBytes.Auto(),
			PeerShare:   cfg.Admission.PeerShare,
			WaitTimeout: cfg.Admission.WaitTimeout,
			UnknownSize: int64(cfg.Admission.UnknownSize), //nolint:gosec // G115: at most 1 TiB (Validate)
			IdleTimeout: cfg.Admission.IdleTimeout,
		},
		GoMemLimit:   cfg.GoMemLimit.ownerConfig(),
		StaleAfter:   cfg.StaleAfter(),
		ReportStatus: cfg.ReportStatus,
		Effective:    cfg,
	}
	if !cfg.Admission.MaxInflightBytes.Off() {
		rc.Admission.Budget = cfg.Admission.MaxInflightBytes.ResolveBudget
	}
	if cfg.Status.HasValue() {
		status := *cfg.Status.Get() // ToServer fills in defaults; keep the config as loaded
		rc.Status = &status
	}
	return rc
}

// samplerConfig maps the sample_interval and signal sections to the
// sampler's configuration. The slow cadence at which limits are re-read is
// left to the sampler's default: it is not a user setting.
func (cfg *Config) samplerConfig() sampler.Config {
	return sampler.Config{
		Interval:      cfg.SampleInterval,
		CPUFastBeta:   cfg.Signal.CPUFastBeta,
		CPUSlowBeta:   cfg.Signal.CPUSlowBeta,
		FallbackCores: cfg.Signal.FallbackCores,
		// Validate bounds memory_limit_mib so the shift cannot overflow.
		MemoryLimit: cfg.Signal.MemoryLimitMiB << 20,
	}
}

// decisionConfig maps the thresholds, rules and recovery_ramp sections to
// the decision engine's configuration, with every signal's rule resolved
// over the default rule.
func (cfg *Config) decisionConfig() decision.Config {
	dc := decision.Config{
		CPU:          cfg.Thresholds.CPU.slot(),
		Mem:          cfg.Thresholds.Mem.slot(),
		RecoveryRamp: cfg.RecoveryRamp,
		Interval:     cfg.SampleInterval,
	}
	for s := range decision.NumSignals {
		dc.Rules[s] = cfg.RuleFor(s)
	}
	return dc
}

func (s SlotConfig) slot() decision.Slot {
	return decision.Slot{Enabled: s.Enabled, Enter: s.Enter, Exit: s.Exit, Hard: s.Hard, BreachN: s.BreachN, MaxShed: s.MaxShed}
}

// slotConfig is the configuration of slot s, for the defaults.
func slotConfig(s decision.Slot) SlotConfig {
	return SlotConfig{Enabled: s.Enabled, Enter: s.Enter, Exit: s.Exit, Hard: s.Hard, BreachN: s.BreachN, MaxShed: s.MaxShed}
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
