// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/softlimit"
)

// The defaults and bounds of the configuration (design §8) that no other
// package owns; createDefaultConfig takes the others from the packages that
// use them. The comments say where a value comes from.
const (
	// Below 10ms the sampler's own file reads become a noticeable share of a
	// core, and CPU windows get too short to measure against CFS periods.
	minCheckInterval = 10 * time.Millisecond
	// maxCheckInterval: a burst fills memory faster than any check sees it
	// (at 200 MB/s memory climbs from enter to the limit in 250ms), so a
	// longer interval leaves the memory lines to the OOM killer.
	maxCheckInterval = 10 * time.Second

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

	// maxCPULine bounds the CPU lines, a share of the effective cores: a
	// value above it is a percent written as a number (enter: 90), and
	// would never shed.
	maxCPULine = 2
	// maxCPUWindow bounds the CPU averages' time constants: a longer one
	// answers an overload minutes late.
	maxCPUWindow = time.Minute
	// maxCPUBreachDuration and maxMemoryBreachDuration bound how long a
	// condition must hold before the state changes: longer leaves an
	// overload unanswered, and memory meets the OOM killer.
	maxCPUBreachDuration    = 10 * time.Second
	maxMemoryBreachDuration = 2 * time.Second

	// minMemoryLimitMiB: a collector's own baseline (binary, runtime,
	// buffers) fills a smaller limit past the memory hard line, a permanent
	// Open.
	minMemoryLimitMiB = 32
	// maxMemoryLimitMiB keeps limit_mib << 20 within a uint64.
	maxMemoryLimitMiB = math.MaxUint64 >> 20

	// maxRetryAfter bounds the delay asked of refused clients: beyond a
	// minute it outlasts the retry window of most clients (an SDK's whole
	// export has 10s), which then drop the data instead of waiting.
	maxRetryAfter = time.Minute

	// defaultStatusEndpoint is used when the status section is present
	// without an endpoint. localhost, as the collector's own defaults: the
	// page has no authentication.
	defaultStatusEndpoint = "localhost:55680"

	// minIdleTimeout: TCP's retransmission timeouts start at 1s, so a
	// shorter bound would cut off healthy connections that lost a packet.
	minIdleTimeout = time.Second
	// maxWaitTimeout bounds how long a body may hold its handler and stop
	// admissions while it waits for the budget.
	maxWaitTimeout = 10 * time.Second
)

// ruleKeyDefault is the key of the default rule under rules.
const ruleKeyDefault = "default"

// routeSignalNames lists the signal names accepted as values of routes.
var routeSignalNames = func() []string {
	names := make([]string, 0, decision.NumSignals)
	for s := range decision.NumSignals {
		names = append(names, s.String())
	}
	return names
}()

// ruleKeys lists the keys accepted under rules, in the order they are
// reported: the default rule, then one per signal.
var ruleKeys = append([]string{ruleKeyDefault}, routeSignalNames...)

// builtinRule is the rule of every signal when rules says nothing.
var builtinRule = decision.DefaultRule()

// Errors of Validate. confmap.Validate, which the collector runs on its
// whole configuration, prefixes those of a section with the section's path
// ("cpu: exit must be < enter, got 0.95 and 0.9").
var (
	errCheckInterval  = fmt.Errorf("check_interval must be between %v and %v", minCheckInterval, maxCheckInterval)
	errRecoveryRamp   = errors.New("recovery_ramp must be >= 0")
	errStatusEndpoint = errors.New("status: endpoint must not be empty")
	errStaleAfter     = fmt.Errorf("stale_after must be 0 (never), or at least %v and at least %d × check_interval", minStaleAfter, minStaleAfterChecks)

	errNotFinite         = errors.New("must be a finite number")
	errExitNotAboveZero  = errors.New("exit must be > 0")
	errExitNotBelowEnter = errors.New("exit must be < enter")
	errEnterNotBelowHard = errors.New("enter must be < hard")
	errMaxShed           = errors.New("max_shed must be in (0, 1]")
	errCPULine           = fmt.Errorf("must be <= %d: the CPU lines are a share of the effective cores (0.9 is 90%%), not a percent", maxCPULine)
	errCPUBreachDuration = fmt.Errorf("breach_duration must be between 0s and %v", maxCPUBreachDuration)
	errCPUWindow         = fmt.Errorf("must be > 0 and <= %v", maxCPUWindow)
	errFallbackCores     = errors.New("fallback_cores must be a number >= 0")
	// errMemoryHardAboveOne: memory is a share of the limit, and above 1
	// the kernel's OOM killer comes first, so a hard line over 1 would
	// never open.
	errMemoryHardAboveOne   = errors.New("hard must be <= 1")
	errMemoryBreachDuration = fmt.Errorf("breach_duration must be between 0s and %v", maxMemoryBreachDuration)
	errMemoryLimitTooSmall  = fmt.Errorf("limit_mib must be 0 (the cgroup's limit) or >= %d: a collector's own baseline fills a smaller limit past the hard line, a permanent Open", minMemoryLimitMiB)
	errMemoryLimitTooLarge  = fmt.Errorf("limit_mib must be <= %d", uint64(maxMemoryLimitMiB))

	errUnknownSignal = errors.New("unknown signal")
	errDropRange     = errors.New("must be in [0, 1]")
	errDropOrder     = errors.New("drop_min must be <= drop_max")

	errRetryAfterMin   = errors.New("min must be >= 0")
	errRetryAfterMax   = fmt.Errorf("max must be between 0s and %v: a longer delay outlasts the clients' retry windows", maxRetryAfter)
	errRetryAfterOrder = errors.New("min must be <= max")

	errUnknownSizeZero       = errors.New("unknown_size must be > 0 when max_inflight_bytes is not 0")
	errUnknownSizeOverBudget = errors.New("unknown_size must be <= max_inflight_bytes")
	errIdleTimeout           = fmt.Errorf("idle_timeout must be 0 (off) or >= %v", minIdleTimeout)
	errPeerShare             = errors.New("peer_share must be in (0, 1]")
	errWaitTimeout           = fmt.Errorf("wait_timeout must be between 0s and %v", maxWaitTimeout)
	errSizeTooLarge          = fmt.Errorf("must be at most %v", maxByteSize)
)

// Config is the configuration of the throttle extension (design §8).
type Config struct {
	// Enabled turns the throttle on. With false no sampler runs and the
	// middleware and processor admit everything; the rest of the
	// configuration is still validated, so a typo fails at start and not on
	// the day the throttle is switched on.
	Enabled bool `mapstructure:"enabled"`

	// ObserveOnly makes and counts every decision, and logs every state
	// change, but refuses nothing: a request the throttle would refuse is
	// counted in throttle_requests as that denial and let in. For tuning
	// the lines on real traffic before turning the throttle on. Default
	// false.
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

	// CPU is how CPU is measured and the lines the CPU slot of every
	// signal's state machine is held to.
	CPU CPUConfig `mapstructure:"cpu"`

	// Memory is the memory limit, the lines of the memory slot, and the Go
	// runtime's soft memory limit.
	Memory MemoryConfig `mapstructure:"memory"`

	// Rules say how each signal is throttled. Keys: default, traces,
	// metrics, logs, profiles. A signal's rule overrides the default rule
	// field by field; the default rule overrides the built-in one
	// (enabled: true, drop_min: 0, drop_max: 1) field by field.
	Rules RulesConfig `mapstructure:"rules"`

	// RetryAfter bounds the delay asked of rejected clients, chosen by why
	// they were refused (design §7). Default 1s to 5s.
	RetryAfter RetryAfterConfig `mapstructure:"retry_after"`

	// RecoveryRamp is how long, after a signal leaves Open, the drop
	// probability stays at least a ramp falling linearly from 1 to 0, so
	// leaving Open does not release a burst. Default 5s; 0 = no ramp.
	RecoveryRamp time.Duration `mapstructure:"recovery_ramp"`

	// Admission bounds the bytes of admitted, unfinished requests.
	Admission AdmissionConfig `mapstructure:"admission"`

	// Hold keeps requests the throttle would refuse, before their body is
	// read, until it admits them or they have waited max_wait (see
	// hold.go).
	Hold HoldConfig `mapstructure:"hold"`

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
	Status configoptional.Optional[confighttp.ServerConfig] `mapstructure:"status"`

	// ReportStatus makes the extension report a RecoverableError to the
	// host (and so to the health check extension) while any signal is Open.
	// Off by default: a readiness probe failing while Open takes the replica
	// out of its Service and moves the load onto the others.
	ReportStatus bool `mapstructure:"report_status"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// CPUConfig is the cpu section: how CPU is measured, and the lines of the
// CPU slot, as a share of the effective cores. Values above 1 are
// meaningful (CFS bursts, or fallback_cores below the cores actually used);
// values above 2 are not. For an enabled slot 0 < exit < enter < hard <= 2.
type CPUConfig struct {
	// Enabled includes CPU in the decision. A disabled slot counts as
	// safe: it never triggers and never blocks recovery; its lines are not
	// validated.
	Enabled bool `mapstructure:"enabled"`
	// Enter: Normal -> Shedding when the slow average is above it for
	// breach_duration.
	Enter float64 `mapstructure:"enter"`
	// Exit: Shedding -> Normal when every slot is below its exit for
	// breach_duration.
	Exit float64 `mapstructure:"exit"`
	// Hard: -> Open when the fast average is at or above it for
	// breach_duration.
	Hard float64 `mapstructure:"hard"`
	// BreachDuration is how long a condition must hold, rounded up to whole
	// checks (at least one). Default 750ms; at most 10s.
	BreachDuration time.Duration `mapstructure:"breach_duration"`
	// MaxShed is the most CPU alone sheds: a cap on its share of the
	// shedding severity, in (0, 1]. Default 0.2.
	MaxShed float64 `mapstructure:"max_shed"`
	// SlowWindow is the time constant of the slow CPU average, the one
	// compared with enter and exit. Default 5s; at most 1m.
	SlowWindow time.Duration `mapstructure:"slow_window"`
	// FastWindow is the time constant of the fast CPU average, the one
	// compared with hard. Default 700ms; at most 1m.
	FastWindow time.Duration `mapstructure:"fast_window"`
	// FallbackCores is the number of cores CPU time is divided by when no
	// CPU quota is set anywhere. 0 = GOMAXPROCS. Fractions are kept.
	FallbackCores float64 `mapstructure:"fallback_cores"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// MemoryConfig is the memory section: the memory limit, the lines of the
// memory slot as a share of it (working set over the limit, at most 1),
// and the Go runtime's soft memory limit. For an enabled slot
// 0 < exit < enter < hard <= 1.
type MemoryConfig struct {
	// Enabled includes memory in the decision. A disabled slot counts as
	// safe; its lines are not validated.
	Enabled bool `mapstructure:"enabled"`
	// Enter, Exit and Hard are the lines, as for CPU; the memory level is
	// not averaged.
	Enter float64 `mapstructure:"enter"`
	Exit  float64 `mapstructure:"exit"`
	Hard  float64 `mapstructure:"hard"`
	// BreachDuration is how long a condition must hold, rounded up to whole
	// checks (at least one). Default 250ms (one check: memory meets the OOM
	// killer); at most 2s.
	BreachDuration time.Duration `mapstructure:"breach_duration"`
	// MaxShed is the most memory alone sheds before Open, in (0, 1].
	// Default 1.
	MaxShed float64 `mapstructure:"max_shed"`
	// LimitMiB overrides the memory limit read from the cgroup when it is
	// lower: above the cgroup's limit the cgroup's is used (and a warning
	// logged). 0 = from the cgroup (no limit there: the memory signal is
	// off); else at least 32.
	LimitMiB uint64 `mapstructure:"limit_mib"`
	// SoftLimit is whether and where the throttle sets the Go runtime's
	// soft memory limit (see softlimit.go).
	SoftLimit SoftLimitConfig `mapstructure:"soft_limit"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// RuleConfig is one entry of rules. A nil field is inherited: a signal's
// from the default rule, the default rule's from the built-in rule
// (enabled: true, drop_min: 0, drop_max: 1).
type RuleConfig struct {
	// Enabled: false exempts the signal; it is always admitted, even in
	// Open, and bypasses the admission budget.
	Enabled *bool `mapstructure:"enabled"`
	// DropMin is the drop probability at the enter line while Shedding.
	DropMin *float64 `mapstructure:"drop_min"`
	// DropMax is the drop probability at the hard line while Shedding.
	// 0 exempts the signal from shedding but not from Open.
	DropMax *float64 `mapstructure:"drop_max"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// RulesConfig is the rules section: a RuleConfig per key, the default
// rule or a signal.
type RulesConfig map[string]RuleConfig

// RetryAfterConfig is the range of the delay asked of rejected clients.
type RetryAfterConfig struct {
	// Min is the shortest delay. Default 0s.
	Min time.Duration `mapstructure:"min"`
	// Max is the longest delay. Default 30s; at most 1m.
	Max time.Duration `mapstructure:"max"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// AdmissionConfig bounds the work admitted and not yet finished.
type AdmissionConfig struct {
	// MaxInflightBytes is the budget of bytes reserved by admitted,
	// unfinished requests: "auto" (default; a share of the memory limit, see
	// InflightBudget.resolve), 0 = off, or a size such as 24MiB.
	MaxInflightBytes InflightBudget `mapstructure:"max_inflight_bytes"`
	// UnknownSize is what a request reserves when it is admitted while no
	// size has been learnt for its signal (HTTP without Content-Length, or
	// compressed; gRPC). Default 1MiB.
	UnknownSize ByteSize `mapstructure:"unknown_size"`
	// IdleTimeout bounds how long a request can hold the budget without
	// sending: an HTTP body that receives nothing for this long fails, a
	// gRPC call that sends no message within it is cancelled, and an HTTP
	// body older than it keeps at most 64KiB reserved beyond what it has
	// received. Default 10s; 0 = off; else at least 1s.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	// PeerShare is the share of the budget that the admitted requests of
	// one peer (remote IP; IPv6 by /64) may hold. Default 0.5; in (0, 1];
	// 1 = no per-peer limit.
	PeerShare float64 `mapstructure:"peer_share"`
	// WaitTimeout is how long, in total, an admitted HTTP body that
	// outgrows its reservation waits for bytes to be released before it
	// fails (429). A gRPC stream that finds the budget full waits for most
	// of its deadline instead, unless this is 0 (refused at once). Default
	// 1s; at most 10s.
	WaitTimeout time.Duration `mapstructure:"wait_timeout"`

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
	_ confmap.Validator = CPUConfig{}
	_ confmap.Validator = MemoryConfig{}
	_ confmap.Validator = SoftLimitConfig{}
	_ confmap.Validator = RulesConfig{}
	_ confmap.Validator = RuleConfig{}
	_ confmap.Validator = RetryAfterConfig{}
	_ confmap.Validator = AdmissionConfig{}
	_ confmap.Validator = HoldConfig{}
	_ confmap.Validator = TarpitConfig{}
	_ confmap.Validator = RoutesConfig{}
)

func ptrTo[T any](v T) *T { return &v }

// createDefaultConfig returns the defaults of design §8, each taken from
// the package that owns it.
func createDefaultConfig() component.Config {
	engine := decision.DefaultConfig()
	return &Config{
		Enabled:       true,
		CheckInterval: sampler.DefaultInterval,
		StaleAfter:    defaultStaleAfter,
		CPU: CPUConfig{
			Enabled:        engine.CPU.Enabled,
			Enter:          engine.CPU.Enter,
			Exit:           engine.CPU.Exit,
			Hard:           engine.CPU.Hard,
			BreachDuration: time.Duration(engine.CPU.BreachN) * engine.Interval,
			MaxShed:        engine.CPU.MaxShed,
			SlowWindow:     sampler.DefaultCPUSlowWindow,
			FastWindow:     sampler.DefaultCPUFastWindow,
		},
		Memory: MemoryConfig{
			Enabled:        engine.Mem.Enabled,
			Enter:          engine.Mem.Enter,
			Exit:           engine.Mem.Exit,
			Hard:           engine.Mem.Hard,
			BreachDuration: time.Duration(engine.Mem.BreachN) * engine.Interval,
			MaxShed:        engine.Mem.MaxShed,
			SoftLimit:      SoftLimitConfig{Enabled: true, Share: softlimit.DefaultShare, HeapTarget: softlimit.DefaultHeapTarget},
		},
		Rules: RulesConfig{
			ruleKeyDefault: {
				Enabled: ptrTo(builtinRule.Enabled),
				DropMin: ptrTo(builtinRule.DropMin),
				DropMax: ptrTo(builtinRule.DropMax),
			},
		},
		RetryAfter:   RetryAfterConfig{Min: middleware.DefaultRetryFloor, Max: middleware.DefaultRetryCeiling},
		RecoveryRamp: engine.RecoveryRamp,
		Admission: AdmissionConfig{
			MaxInflightBytes: autoInflightBudget(),
			UnknownSize:      middleware.DefaultUnknownSize,
			IdleTimeout:      middleware.DefaultIdleTimeout,
			PeerShare:        middleware.DefaultPeerShare,
			WaitTimeout:      middleware.DefaultBudgetWait,
		},
		Hold:   HoldConfig{MaxWait: defaultHoldMaxWait, MaxRequests: defaultHoldMaxRequests},
		Tarpit: TarpitConfig{MaxRequests: defaultTarpitMaxRequests},
		Status: configoptional.Default(defaultStatusServerConfig()),
		// ReportStatus false: see the field.
	}
}

func defaultStatusServerConfig() confighttp.ServerConfig {
	cfg := confighttp.NewDefaultServerConfig()
	cfg.NetAddr.Endpoint = defaultStatusEndpoint
	return cfg
}

// ruleFor returns the effective rule of signal s: its entry in rules over
// the default rule, field by field.
func (cfg *Config) ruleFor(s decision.Signal) decision.Rule {
	return cfg.Rules[s.String()].over(cfg.Rules.defaultRule())
}

func (rs RulesConfig) defaultRule() decision.Rule {
	return rs[ruleKeyDefault].over(builtinRule)
}

// over returns base with the fields r sets replaced.
func (r RuleConfig) over(base decision.Rule) decision.Rule {
	if r.Enabled != nil {
		base.Enabled = *r.Enabled
	}
	if r.DropMin != nil {
		base.DropMin = *r.DropMin
	}
	if r.DropMax != nil {
		base.DropMax = *r.DropMax
	}
	return base
}

// Validate checks the top-level fields and what spans sections. Each
// section validates itself, and the collector's confmap.Validate calls
// them all, whether the throttle is enabled or not, so that a typo fails at
// start and not on the day the throttle is switched on.
func (cfg *Config) Validate() error {
	var errs []error
	if cfg.CheckInterval < minCheckInterval || cfg.CheckInterval > maxCheckInterval {
		errs = append(errs, fmt.Errorf("%w, got %v", errCheckInterval, cfg.CheckInterval))
	}
	if cfg.StaleAfter != 0 && (cfg.StaleAfter < minStaleAfter || cfg.StaleAfter < minStaleAfterChecks*cfg.CheckInterval) {
		errs = append(errs, fmt.Errorf("%w, got %v at a check_interval of %v", errStaleAfter, cfg.StaleAfter, cfg.CheckInterval))
	}
	if cfg.RecoveryRamp < 0 {
		errs = append(errs, fmt.Errorf("%w, got %v", errRecoveryRamp, cfg.RecoveryRamp))
	}
	// The server's own settings are validated by confighttp through
	// configoptional when the section is present.
	if cfg.Status.HasValue() && cfg.Status.Get().NetAddr.Endpoint == "" {
		errs = append(errs, errStatusEndpoint)
	}
	return errors.Join(errs...)
}

// Validate checks the cpu section: the lines of an enabled slot, and how
// CPU is measured whether the slot is enabled or not (the status page and
// the telemetry show it).
func (c CPUConfig) Validate() error {
	var errs []error
	if c.Enabled {
		errs = append(errs, validateLines(c.Enter, c.Exit, c.Hard)...)
		for _, f := range []struct {
			name string
			v    float64
		}{{"enter", c.Enter}, {"exit", c.Exit}, {"hard", c.Hard}} {
			if f.v > maxCPULine && !math.IsInf(f.v, 1) {
				errs = append(errs, fmt.Errorf("%s %w, got %s", f.name, errCPULine, formatConfigFloat(f.v)))
			}
		}
		if c.BreachDuration < 0 || c.BreachDuration > maxCPUBreachDuration {
			errs = append(errs, fmt.Errorf("%w, got %v", errCPUBreachDuration, c.BreachDuration))
		}
		errs = append(errs, validateMaxShed(c.MaxShed)...)
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"slow_window", c.SlowWindow}, {"fast_window", c.FastWindow}} {
		if f.v <= 0 || f.v > maxCPUWindow {
			errs = append(errs, fmt.Errorf("%s %w, got %v", f.name, errCPUWindow, f.v))
		}
	}
	if !(c.FallbackCores >= 0) || math.IsInf(c.FallbackCores, 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errFallbackCores, formatConfigFloat(c.FallbackCores)))
	}
	return errors.Join(errs...)
}

// Validate checks the memory section: the lines of an enabled slot, and
// the memory limit whether the slot is enabled or not (the soft memory
// limit and the admission budget follow it). The soft_limit section
// validates itself.
func (c MemoryConfig) Validate() error {
	var errs []error
	if c.Enabled {
		errs = append(errs, validateLines(c.Enter, c.Exit, c.Hard)...)
		if c.Hard > 1 && !math.IsInf(c.Hard, 1) {
			errs = append(errs, fmt.Errorf("%w, got %s", errMemoryHardAboveOne, formatConfigFloat(c.Hard)))
		}
		if c.BreachDuration < 0 || c.BreachDuration > maxMemoryBreachDuration {
			errs = append(errs, fmt.Errorf("%w, got %v", errMemoryBreachDuration, c.BreachDuration))
		}
		errs = append(errs, validateMaxShed(c.MaxShed)...)
	}
	switch {
	case c.LimitMiB != 0 && c.LimitMiB < minMemoryLimitMiB:
		errs = append(errs, fmt.Errorf("%w, got %d", errMemoryLimitTooSmall, c.LimitMiB))
	case c.LimitMiB > maxMemoryLimitMiB:
		errs = append(errs, fmt.Errorf("%w, got %d", errMemoryLimitTooLarge, c.LimitMiB))
	}
	return errors.Join(errs...)
}

// validateLines checks that enter, exit and hard are finite and
// 0 < exit < enter < hard. Comparisons are written so NaN fails them.
func validateLines(enter, exit, hard float64) []error {
	var errs []error
	finite := true
	for _, f := range []struct {
		name string
		v    float64
	}{{"enter", enter}, {"exit", exit}, {"hard", hard}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("%s %w, got %s", f.name, errNotFinite, formatConfigFloat(f.v)))
			finite = false
		}
	}
	if !finite {
		return errs
	}
	if exit <= 0 {
		errs = append(errs, fmt.Errorf("%w, got %s", errExitNotAboveZero, formatConfigFloat(exit)))
	}
	if exit >= enter {
		errs = append(errs, fmt.Errorf("%w, got %s and %s", errExitNotBelowEnter, formatConfigFloat(exit), formatConfigFloat(enter)))
	}
	if enter >= hard {
		errs = append(errs, fmt.Errorf("%w, got %s and %s", errEnterNotBelowHard, formatConfigFloat(enter), formatConfigFloat(hard)))
	}
	return errs
}

func validateMaxShed(v float64) []error {
	if !(v > 0 && v <= 1) { // also rejects NaN
		return []error{fmt.Errorf("%w, got %s", errMaxShed, formatConfigFloat(v))}
	}
	return nil
}

// Validate checks the keys of the rules section and, for a signal's rule
// that sets only one of drop_min and drop_max, their order once the other
// is inherited from the default rule. Each rule checks itself; a bad
// default is reported once, at rules::default, not again for every signal
// inheriting it.
func (rs RulesConfig) Validate() error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(rs)) {
		if !slices.Contains(ruleKeys, k) {
			errs = append(errs, fmt.Errorf("%w %q, want one of %s", errUnknownSignal, k, strings.Join(ruleKeys, ", ")))
		}
	}
	for _, k := range routeSignalNames {
		r, ok := rs[k]
		if !ok || (r.DropMin == nil) == (r.DropMax == nil) || r.dropRangeErr() != nil {
			continue
		}
		eff := r.over(rs.defaultRule())
		if eff.DropMin > eff.DropMax {
			inherited := "drop_min"
			if r.DropMax == nil {
				inherited = "drop_max"
			}
			errs = append(errs, fmt.Errorf("%s: %w, got %s and %s (%s inherited from %s)", k, errDropOrder,
				formatConfigFloat(eff.DropMin), formatConfigFloat(eff.DropMax), inherited, ruleKeyDefault))
		}
	}
	return errors.Join(errs...)
}

// Validate checks that drop_min and drop_max, where set, are in [0, 1] and
// in order.
func (r RuleConfig) Validate() error {
	if err := r.dropRangeErr(); err != nil {
		return err
	}
	if r.DropMin != nil && r.DropMax != nil && *r.DropMin > *r.DropMax {
		return fmt.Errorf("%w, got %s and %s", errDropOrder, formatConfigFloat(*r.DropMin), formatConfigFloat(*r.DropMax))
	}
	return nil
}

func (r RuleConfig) dropRangeErr() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    *float64
	}{{"drop_min", r.DropMin}, {"drop_max", r.DropMax}} {
		if f.v != nil && !(*f.v >= 0 && *f.v <= 1) { // also rejects NaN
			errs = append(errs, fmt.Errorf("%s %w, got %s", f.name, errDropRange, formatConfigFloat(*f.v)))
		}
	}
	return errors.Join(errs...)
}

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

// Validate checks the admission section. With the budget on, a request of
// unknown size must reserve something, and must fit in a fixed budget, or
// every chunked request would be rejected.
func (a AdmissionConfig) Validate() error {
	var errs []error
	if !a.MaxInflightBytes.isOff() {
		if a.UnknownSize == 0 {
			errs = append(errs, errUnknownSizeZero)
		} else if !a.MaxInflightBytes.isAuto() && a.UnknownSize > a.MaxInflightBytes.fixedSize() {
			errs = append(errs, fmt.Errorf("%w, got %v and %v", errUnknownSizeOverBudget, a.UnknownSize, a.MaxInflightBytes.fixedSize()))
		}
	}
	if a.IdleTimeout != 0 && a.IdleTimeout < minIdleTimeout {
		errs = append(errs, fmt.Errorf("%w, got %v", errIdleTimeout, a.IdleTimeout))
	}
	if !(a.PeerShare > 0 && a.PeerShare <= 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errPeerShare, formatConfigFloat(a.PeerShare)))
	}
	if a.WaitTimeout < 0 || a.WaitTimeout > maxWaitTimeout {
		errs = append(errs, fmt.Errorf("%w, got %v", errWaitTimeout, a.WaitTimeout))
	}
	if a.MaxInflightBytes.fixedSize() > maxByteSize {
		errs = append(errs, fmt.Errorf("max_inflight_bytes %w, got %v", errSizeTooLarge, a.MaxInflightBytes.fixedSize()))
	}
	if a.UnknownSize > maxByteSize {
		errs = append(errs, fmt.Errorf("unknown_size %w, got %v", errSizeTooLarge, a.UnknownSize))
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
