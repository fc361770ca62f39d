// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/statuspage"
)

// The bounds of the request path's sections; every other section's are in
// the package that owns it.
const (
	// maxRetryAfter bounds the delay asked of refused clients: beyond a
	// minute it outlasts the retry window of most clients (an SDK's whole
	// export has 10s), which then drop the data instead of waiting.
	maxRetryAfter = time.Minute
)

// routeSignalNames lists the signal names accepted as values of routes.
var routeSignalNames = func() []string {
	names := make([]string, 0, decision.NumSignals)
	for s := range decision.NumSignals {
		names = append(names, s.String())
	}
	return names
}()

// Errors of the request path's sections. confmap.Validate, which the
// collector runs on its whole configuration, prefixes those of a section
// with the section's path ("retry_after: min must be <= max").
var (
	errUnknownSignal = errors.New("unknown signal")

	errRetryAfterMin   = errors.New("min must be >= 0")
	errRetryAfterMax   = fmt.Errorf("max must be between 0s and %v: a longer delay outlasts the clients' retry windows", maxRetryAfter)
	errRetryAfterOrder = errors.New("min must be <= max")
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

	// Rules say how each signal is throttled. Keys: default, traces,
	// metrics, logs, profiles. A signal's rule overrides the default rule
	// field by field; the default rule overrides the built-in one
	// (enabled: true, drop_min: 0, drop_max: 1) field by field.
	Rules decision.RulesConfig `mapstructure:"rules"`

	// RetryAfter bounds the delay asked of rejected clients, chosen by why
	// they were refused. Default 1s to 5s.
	RetryAfter RetryAfterConfig `mapstructure:"retry_after"`

	// Admission bounds the bytes of admitted, unfinished requests and
	// shares them fairly between clients.
	Admission admission.Config `mapstructure:"admission"`

	// Hold keeps requests the throttle would refuse, before their body is
	// read, until it admits them or they have waited max_wait (see
	// hold.go).
	Hold admission.HoldConfig `mapstructure:"hold"`

	// Tarpit holds HTTP rejections in Shedding (and by the admission
	// budget) before they are answered, so that clients which re-send at
	// once do not turn rejections into a load of their own. Off by default.
	Tarpit TarpitConfig `mapstructure:"tarpit"`

	// Routes classify requests the default OTLP paths and methods do not
	// cover.
	Routes RoutesConfig `mapstructure:"routes"`

	// Status is the optional HTTP server of the status page (GET /status as
	// JSON, GET / as a page). Absent (or enabled: false) = off. Present
	// without an endpoint, it listens on localhost:55680.
	Status configoptional.Optional[statuspage.Config] `mapstructure:"status"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// RetryAfterConfig is the range of the delay asked of rejected clients.
type RetryAfterConfig struct {
	// Min is the shortest delay. Default 1s.
	Min time.Duration `mapstructure:"min"`
	// Max is the longest delay. Default 5s; at most 1m.
	Max time.Duration `mapstructure:"max"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// RoutesConfig maps extra HTTP paths and gRPC methods to signals.
type RoutesConfig struct {
	// HTTP maps a URL path (clean, starting with "/") to a signal name.
	HTTP map[string]string `mapstructure:"http"`
	// GRPC maps a full method name ("/pkg.Service/Method") to a signal name.
	GRPC map[string]string `mapstructure:"grpc"`

	// prevent unkeyed literal initialization
	_ struct{}
}

var (
	_ component.Config  = (*Config)(nil)
	_ confmap.Validator = (*Config)(nil)
	_ confmap.Validator = RetryAfterConfig{}
	_ confmap.Validator = TarpitConfig{}
	_ confmap.Validator = RoutesConfig{}
)

// createDefaultConfig composes the defaults of the packages that own the
// sections.
func createDefaultConfig() component.Config {
	return &Config{
		Settings:   runner.DefaultSettings(),
		CPU:        runner.DefaultCPUConfig(),
		Memory:     runner.DefaultMemoryConfig(),
		Rules:      decision.DefaultRulesConfig(),
		RetryAfter: RetryAfterConfig{Min: middleware.DefaultRetryFloor, Max: middleware.DefaultRetryCeiling},
		Admission:  admission.NewDefaultConfig(),
		Hold:       admission.NewDefaultHoldConfig(),
		Tarpit:     TarpitConfig{MaxRequests: defaultTarpitMaxRequests},
		Status:     configoptional.Default(statuspage.DefaultConfig()),
	}
}

// Validate checks the top-level settings. Each section validates itself,
// and the collector's confmap.Validate calls them all, whether the
// throttle is enabled or not, so that a typo fails at start and not on the
// day the throttle is switched on.
func (cfg *Config) Validate() error { return cfg.Check() }

// Validate checks the retry_after range.
func (c RetryAfterConfig) Validate() error {
	var errs []error
	if c.Min < 0 {
		errs = append(errs, fmt.Errorf("%w, got %v", errRetryAfterMin, c.Min))
	}
	if c.Max < 0 || c.Max > maxRetryAfter {
		errs = append(errs, fmt.Errorf("%w, got %v", errRetryAfterMax, c.Max))
	}
	if c.Min > c.Max {
		errs = append(errs, fmt.Errorf("%w, got %v and %v", errRetryAfterOrder, c.Min, c.Max))
	}
	return errors.Join(errs...)
}

// Validate checks every route's key with the middleware's checks and its
// signal name, in key order.
func (rc RoutesConfig) Validate() error {
	var errs []error
	check := func(kind, key string, keyErr error, sig string) {
		if keyErr != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", kind, key, keyErr))
		}
		if _, ok := decision.ParseSignal(sig); !ok {
			errs = append(errs, fmt.Errorf("%s %q: %w %q, want one of %s", kind, key, errUnknownSignal, sig, strings.Join(routeSignalNames, ", ")))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(rc.HTTP)) {
		check("http", p, middleware.CheckHTTPRoute(p), rc.HTTP[p])
	}
	for _, m := range slices.Sorted(maps.Keys(rc.GRPC)) {
		check("grpc", m, middleware.CheckGRPCRoute(m), rc.GRPC[m])
	}
	return errors.Join(errs...)
}

func formatConfigFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
