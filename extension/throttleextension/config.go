// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/downstream"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/statuspage"
)

// Config is the configuration of the throttle extension: the sections of
// the packages that own them, composed. The top-level settings (enabled,
// observe_only, check_interval, stale_after, recovery_ramp, report_status)
// are the runner's.
type Config struct {
	runner.Settings `mapstructure:",squash"`

	// CPU is how CPU is measured and the lines it is held to.
	CPU runner.CPUConfig `mapstructure:"cpu"`

	// Memory is the memory limit, the lines memory is held to, and the Go
	// runtime's soft memory limit.
	Memory runner.MemoryConfig `mapstructure:"memory"`

	// Downstream holds the fullest exporter sending queue to lines, read
	// from the collector's own metrics. Off by default.
	Downstream downstream.Config `mapstructure:"downstream"`

	// Rules say how each signal is throttled. Keys: default, traces,
	// metrics, logs, profiles. A signal's rule overrides the default rule
	// field by field; the default rule overrides the built-in one
	// (enabled: true, drop_min: 0, drop_max: 1) field by field.
	Rules decision.RulesConfig `mapstructure:"rules"`

	// RetryAfter bounds the delay asked of rejected clients, chosen by why
	// they were refused. Default 1s to 5s.
	RetryAfter middleware.RetryConfig `mapstructure:"retry_after"`

	// Admission bounds the bytes of admitted, unfinished requests and
	// shares them fairly between clients.
	Admission admission.Config `mapstructure:"admission"`

	// Hold keeps requests the throttle would refuse, before their body is
	// read, until it admits them or they have waited max_wait (see
	// internal/admission/hold.go).
	Hold admission.HoldConfig `mapstructure:"hold"`

	// Tarpit holds HTTP rejections in Shedding (and by the admission
	// budget) before they are answered, so that clients which re-send at
	// once do not turn rejections into a load of their own. Off by default.
	Tarpit middleware.TarpitConfig `mapstructure:"tarpit"`

	// Routes classify requests the default OTLP paths and methods do not
	// cover.
	Routes middleware.RoutesConfig `mapstructure:"routes"`

	// Status is the optional HTTP server of the status page (GET /status as
	// JSON, GET / as a page). Absent (or enabled: false) = off. Present
	// without an endpoint, it listens on localhost:55680.
	Status configoptional.Optional[statuspage.Config] `mapstructure:"status"`

	// prevent unkeyed literal initialization
	_ struct{}
}

var (
	_ component.Config  = (*Config)(nil)
	_ confmap.Validator = (*Config)(nil)
)

// createDefaultConfig composes the defaults of the packages that own the
// sections.
func createDefaultConfig() component.Config {
	return &Config{
		Settings:   runner.DefaultSettings(),
		CPU:        runner.DefaultCPUConfig(),
		Memory:     runner.DefaultMemoryConfig(),
		Downstream: downstream.DefaultConfig(),
		Rules:      decision.DefaultRulesConfig(),
		RetryAfter: middleware.NewDefaultRetryConfig(),
		Admission:  admission.NewDefaultConfig(),
		Hold:       admission.NewDefaultHoldConfig(),
		Tarpit:     middleware.NewDefaultTarpitConfig(),
		Status:     configoptional.Default(statuspage.DefaultConfig()),
	}
}

// Validate checks the top-level settings. Each section validates itself,
// and the collector's confmap.Validate calls them all, whether the
// throttle is enabled or not, so that a typo fails at start and not on the
// day the throttle is switched on.
func (cfg *Config) Validate() error { return cfg.Check() }
