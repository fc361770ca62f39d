// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"errors"
	"fmt"
	"time"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/downstream"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/statuspage"
)

const (
	// defaultStaleAfter: a stale level falls back to admitting, and the
	// sampler goroutine is most likely to be starved exactly when the
	// collector is overloaded, so a false "stale" is the dangerous mistake
	// (a flood let in while memory is high; an OOM kill is final) and a long
	// hold only the cheap one (a few more seconds of retryable rejections).
	// The bound is therefore generous: as long as the recovery ramp, and far
	// above CFS throttling stalls (one 100ms period) and GC pauses.
	defaultStaleAfter = 5 * time.Second
	// minStaleAfter: under a second a CFS-throttled or GC-paused sampler
	// reads as stale and turns Open into admitting.
	minStaleAfter = time.Second
	// minStaleAfterChecks: the next check lands up to one interval after
	// the last sample by design, so a bound under two would flap on timer
	// jitter.
	minStaleAfterChecks = 2
)

// Settings are the top-level settings of the extension's configuration
// that the runner reads; the extension squashes them into its Config, so
// that one is added here and where it is used. Check validates them.
type Settings struct {
	// Enabled turns the throttle on. With false no sampler runs and the
	// middleware and processor admit everything; the rest of the
	// configuration is still validated, so a typo fails at start and not on
	// the day the throttle is switched on. Default true.
	Enabled bool `mapstructure:"enabled"`
	// ObserveOnly makes and counts every decision, and logs every state
	// change, but refuses nothing: a request the throttle would refuse is
	// counted in throttle_requests as decision=would_deny, with its reason,
	// and let in. For tuning the lines on real traffic before turning the
	// throttle on. Default false.
	ObserveOnly bool `mapstructure:"observe_only"`
	// CheckInterval is the time between two checks of CPU and memory.
	// Default 250ms; from 10ms to 10s.
	CheckInterval time.Duration `mapstructure:"check_interval"`
	// StaleAfter bounds how long decisions act on an old water level: when
	// no fresh check has been published for this long (the sampler
	// goroutine starved or blocked), every signal is treated as Normal
	// until a fresh one arrives. 0 = never: hold the last level. Default
	// 5s; else at least 1s and at least 2 × check_interval.
	StaleAfter time.Duration `mapstructure:"stale_after"`
	// RecoveryRamp is how long, after a signal leaves an Open in which
	// memory reached its hard line, the drop probability stays at least a
	// ramp falling linearly from 1 to 0, so leaving Open does not release a
	// burst. Default 5s; 0 = no ramp.
	RecoveryRamp time.Duration `mapstructure:"recovery_ramp"`
	// ReportStatus makes the extension report a RecoverableError to the
	// host (and so to the health check extension) while any signal is Open.
	// Off by default: a readiness probe failing while Open takes the
	// replica out of its Service and moves the load onto the others.
	ReportStatus bool `mapstructure:"report_status"`
}

// DefaultSettings are the top-level settings' defaults.
func DefaultSettings() Settings {
	return Settings{
		Enabled:       true,
		CheckInterval: sampler.DefaultInterval,
		StaleAfter:    defaultStaleAfter,
		RecoveryRamp:  decision.DefaultRecoveryRamp,
	}
}

var errStaleAfter = fmt.Errorf("stale_after must be 0 (never), or at least %v and at least %d × check_interval", minStaleAfter, minStaleAfterChecks)

// Check validates the settings. It is not Validate: the collector would
// call that a second time on the squashed struct, under a path of its own.
func (s Settings) Check() error {
	errs := []error{sampler.CheckInterval(s.CheckInterval)}
	if s.StaleAfter != 0 && (s.StaleAfter < minStaleAfter || s.StaleAfter < minStaleAfterChecks*s.CheckInterval) {
		errs = append(errs, fmt.Errorf("%w, got %v at a check_interval of %v", errStaleAfter, s.StaleAfter, s.CheckInterval))
	}
	errs = append(errs, decision.CheckRecoveryRamp(s.RecoveryRamp))
	return errors.Join(errs...)
}

// Config is the runner's configuration: the extension's sections that the
// runner's parts own, passed on as they are, and the request path's,
// resolved by the extension.
type Config struct {
	Settings
	CPU    CPUConfig
	Memory MemoryConfig
	// Downstream is the exporters' queues and the lines they are held to.
	Downstream downstream.Config
	Rules      decision.RulesConfig
	// Status is the status page's server; nil when the page is off.
	Status *statuspage.Config

	// Routes classify requests by HTTP path and gRPC method.
	Routes middleware.RoutesConfig
	// RetryAfter bounds the delay a refused client is asked to wait.
	RetryAfter middleware.RetryConfig
	// Tarpit configures the HTTP tarpit (0: off).
	Tarpit middleware.TarpitConfig
	// Hold configures the hold (0: off).
	Hold admission.HoldConfig
	// Admission configures the admission budget and its fairness.
	Admission admission.Config

	// Effective is the extension's configuration as loaded (defaults
	// filled in), which the status page shows: it is marshalled through
	// confmap, so its keys are the mapstructure tags. Nil shows none.
	Effective any
}
