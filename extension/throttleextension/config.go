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
	"github.com/otelthrottle/throttle/internal/gomemlimit"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// The defaults and bounds of the configuration (design §8) that no other
// package owns; createDefaultConfig takes the others from the packages that
// use them. The comments say where a value comes from.
const (
	// Below 10ms the sampler's own file reads become a noticeable share of a
	// core, and CPU windows get too short to measure against CFS periods.
	minSampleInterval = 10 * time.Millisecond

	// defaultStaleAfterIntervals is 5s at the default interval. A stale
	// level falls back to admitting, and the sampler goroutine is most
	// likely to be starved exactly when the collector is overloaded, so a
	// false "stale" is the dangerous mistake (a flood let in while memory is
	// high; an OOM kill is final) and a long hold only the cheap one (a few
	// more seconds of retryable rejections). The bound is therefore generous:
	// as long as the recovery ramp, and far above CFS throttling stalls
	// (one 100ms period) and GC pauses.
	defaultStaleAfterIntervals = 20
	// minStaleAfterIntervals: the next tick lands up to one interval after the
	// last sample by design, so a bound of 1 would flap on timer jitter.
	minStaleAfterIntervals = 2

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

	// maxPacingDelay bounds how long a rejected client and a shutdown wait
	// on a held request.
	maxPacingDelay = 10 * time.Second
	// defaultPacingMaxHeld bounds the memory held rejections pin, a
	// goroutine and connection buffers each (docs/design.md §7), to a few
	// MiB.
	defaultPacingMaxHeld = 512

	// maxMemoryLimitMiB keeps memory_limit_mib << 20 within a uint64.
	maxMemoryLimitMiB = math.MaxUint64 >> 20
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
// ("thresholds::cpu: exit must be < enter, got 0.95 and 0.9").
var (
	errSampleInterval      = fmt.Errorf("sample_interval must be >= %v", minSampleInterval)
	errRecoveryRamp        = errors.New("recovery_ramp must be >= 0")
	errStatusEndpoint      = errors.New("status: endpoint must not be empty")
	errStaleAfterIntervals = fmt.Errorf("stale_after_intervals must be 0 (never) or >= %d", minStaleAfterIntervals)
	errStaleAfterOverflow  = errors.New("stale_after_intervals is too large")

	errCPUSlowBeta    = errors.New("cpu_slow_beta must be in (0, 1)")
	errCPUFastBeta    = errors.New("cpu_fast_beta must be in (0, 1)")
	errFallbackCores  = errors.New("fallback_cores must be a number >= 0")
	errMemoryLimitMiB = fmt.Errorf("memory_limit_mib must be <= %d", uint64(maxMemoryLimitMiB))

	errNotFinite         = errors.New("must be a finite number")
	errExitNotAboveZero  = errors.New("exit must be > 0")
	errExitNotBelowEnter = errors.New("exit must be < enter")
	errEnterNotBelowHard = errors.New("enter must be < hard")
	errBreachN           = errors.New("breach_n must be >= 1")
	errMaxShed           = errors.New("max_shed must be in (0, 1]")
	// errMemHardAboveOne: memory is a share of the limit, and above 1 the
	// kernel's OOM killer comes first, so a hard line over 1 would never
	// open.
	errMemHardAboveOne = errors.New("mem: hard must be <= 1")

	errUnknownSignal = errors.New("unknown signal")
	errDropRange     = errors.New("must be in [0, 1]")
	errDropOrder     = errors.New("drop_min must be <= drop_max")

	errRetryAfterMin   = errors.New("min must be >= 0")
	errRetryAfterMax   = errors.New("max must be >= 0")
	errRetryAfterOrder = errors.New("min must be <= max")

	errUnknownSizeZero       = errors.New("unknown_size must be > 0 when max_inflight_bytes is not 0")
	errUnknownSizeOverBudget = errors.New("unknown_size must be <= max_inflight_bytes")
	errIdleTimeout           = fmt.Errorf("idle_timeout must be 0 (off) or >= %v", minIdleTimeout)
	errPeerShare             = errors.New("peer_share must be in (0, 1]")
	errWaitTimeout           = fmt.Errorf("wait_timeout must be between 0s and %v", maxWaitTimeout)
	errSizeTooLarge          = fmt.Errorf("must be at most %v", maxByteSize)

	errPacingDelay   = fmt.Errorf("delay must be between 0s and %v", maxPacingDelay)
	errPacingMaxHeld = errors.New("max_held must be >= 0")
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

	// SampleInterval is the time between two samples of CPU and memory.
	// Default 250ms; at least 10ms.
	SampleInterval time.Duration `mapstructure:"sample_interval"`

	// Signal configures how the water level is computed.
	Signal SignalConfig `mapstructure:"signal"`

	// Thresholds are the lines of the CPU and memory slots of every signal's
	// state machine.
	Thresholds ThresholdsConfig `mapstructure:"thresholds"`

	// Rules say how each signal is throttled. Keys: default, traces,
	// metrics, logs, profiles. A signal's rule overrides the default rule
	// field by field; the default rule overrides the built-in one
	// (enabled: true, drop_min: 0, drop_max: 1) field by field.
	Rules RulesConfig `mapstructure:"rules"`

	// RetryAfter is the range the delay asked of rejected clients is drawn
	// from (uniformly, so they do not retry in lockstep). Default 0s to 30s.
	RetryAfter RetryAfterConfig `mapstructure:"retry_after"`

	// RecoveryRamp is how long, after a signal leaves Open, the drop
	// probability stays at least a ramp falling linearly from 1 to 0, so
	// leaving Open does not release a burst. Default 5s; 0 = no ramp.
	RecoveryRamp time.Duration `mapstructure:"recovery_ramp"`

	// Admission bounds the bytes of admitted, unfinished requests.
	Admission AdmissionConfig `mapstructure:"admission"`

	// Pacing holds HTTP rejections in Shedding (and by the admission
	// budget) before they are answered, so that clients which re-send at
	// once do not turn rejections into a load of their own. Off by default.
	Pacing PacingConfig `mapstructure:"pacing"`

	// Queue holds HTTP requests the throttle would refuse, before their body
	// is read, until it admits them or they have waited max_wait (see
	// queue.go).
	Queue QueueConfig `mapstructure:"queue"`

	// GoMemLimit is whether and where the throttle sets the Go runtime's
	// soft memory limit (see gomemlimit.go).
	GoMemLimit GoMemLimitConfig `mapstructure:"gomemlimit"`

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

	// StaleAfterIntervals bounds how long decisions act on an old water
	// level: when no fresh sample has been published for this many sample
	// intervals (the sampler goroutine starved or blocked), every signal is
	// treated as Normal until a fresh sample arrives. 0 = never: hold the
	// last level. Default 20 (5s at 250ms); at least 2.
	StaleAfterIntervals int `mapstructure:"stale_after_intervals"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// SignalConfig configures how CPU and memory are turned into water levels.
type SignalConfig struct {
	// CPUSlowBeta is the history weight of the slow CPU average, the one
	// compared with enter and exit. Default 0.95; in (0, 1).
	CPUSlowBeta float64 `mapstructure:"cpu_slow_beta"`
	// CPUFastBeta is the history weight of the fast CPU average, the one
	// compared with hard. Default 0.7; in (0, 1).
	CPUFastBeta float64 `mapstructure:"cpu_fast_beta"`
	// FallbackCores is the number of cores CPU time is divided by when no
	// CPU quota is set anywhere. 0 = GOMAXPROCS. Fractions are kept.
	FallbackCores float64 `mapstructure:"fallback_cores"`
	// MemoryLimitMiB overrides the memory limit read from the cgroup.
	// 0 = from the cgroup (no limit there: the memory signal is off).
	MemoryLimitMiB uint64 `mapstructure:"memory_limit_mib"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// ThresholdsConfig holds the two resource slots.
type ThresholdsConfig struct {
	// CPU is the CPU slot: slow = cpu_slow, fast = cpu_fast, as a share of
	// the effective cores. Values above 1 are meaningful (CFS bursts, or
	// fallback_cores below the cores actually used).
	CPU SlotConfig `mapstructure:"cpu"`
	// Mem is the memory slot: working set over the memory limit, at most 1.
	Mem SlotConfig `mapstructure:"mem"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// SlotConfig are the lines of one resource. For an enabled slot
// 0 < exit < enter < hard.
type SlotConfig struct {
	// Enabled includes the slot in the decision. A disabled slot counts as
	// safe: it never triggers and never blocks recovery; its lines are not
	// validated.
	Enabled bool `mapstructure:"enabled"`
	// Enter: Normal -> Shedding when the slow level is above it for
	// breach_n frames.
	Enter float64 `mapstructure:"enter"`
	// Exit: Shedding -> Normal when every slot's slow level is below its
	// exit for breach_n frames.
	Exit float64 `mapstructure:"exit"`
	// Hard: -> Open when the fast level is at or above it for breach_n
	// frames.
	Hard float64 `mapstructure:"hard"`
	// BreachN is the number of consecutive frames a condition must hold.
	// At least 1.
	BreachN int `mapstructure:"breach_n"`
	// MaxShed is the most this resource alone sheds: a cap on its share of
	// the shedding severity, in (0, 1]. Default cpu 0.2, mem 1.
	MaxShed float64 `mapstructure:"max_shed"`

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

// Rule is a rule with every field resolved.
type Rule = decision.Rule

// RetryAfterConfig is the range of the delay asked of rejected clients.
type RetryAfterConfig struct {
	// Min is the shortest delay. Default 0s.
	Min time.Duration `mapstructure:"min"`
	// Max is the longest delay. Default 30s.
	Max time.Duration `mapstructure:"max"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// AdmissionConfig bounds the work admitted and not yet finished.
type AdmissionConfig struct {
	// MaxInflightBytes is the budget of bytes reserved by admitted,
	// unfinished requests: "auto" (default; a share of the memory limit, see
	// InflightBudget.ResolveBudget), 0 = off, or a size such as 24MiB.
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
	// fails (429). Default 1s; 0 = fail at once; at most 10s.
	WaitTimeout time.Duration `mapstructure:"wait_timeout"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// PacingConfig is how HTTP shed and budget rejections are paced (see
// middleware.Pacer). Open rejections, gRPC rejections, and requests whose
// body is over 256 KiB, of unknown length or compressed, or that wait for
// "100 Continue", are answered at once.
//
// Off by default: it helps against clients that ignore Retry-After and send
// uncompressed bodies (docs/results.md), but held rejections occupy the
// request slots of clients that share them between signals, exempt ones
// included, and the OTLP exporters compress (and honour Retry-After) by
// default.
type PacingConfig struct {
	// Delay is how long a rejection is held, after its body has been read
	// and discarded, before the 429 is written. Default 0s = off; 1s is a
	// good start; at most 10s. A held request also delays the receiver's
	// shutdown by up to this long.
	Delay time.Duration `mapstructure:"delay"`
	// MaxHeld bounds the rejections held at once (each holds a goroutine
	// and a connection's buffers, plus a read buffer while its body is
	// read); beyond it they are answered at once. Default 512; 0 = off.
	MaxHeld int `mapstructure:"max_held"`

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
	_ confmap.Validator = SignalConfig{}
	_ confmap.Validator = ThresholdsConfig{}
	_ confmap.Validator = SlotConfig{}
	_ confmap.Validator = RulesConfig{}
	_ confmap.Validator = RuleConfig{}
	_ confmap.Validator = RetryAfterConfig{}
	_ confmap.Validator = AdmissionConfig{}
	_ confmap.Validator = PacingConfig{}
	_ confmap.Validator = QueueConfig{}
	_ confmap.Validator = GoMemLimitConfig{}
	_ confmap.Validator = RoutesConfig{}
)

func ptrTo[T any](v T) *T { return &v }

// createDefaultConfig returns the defaults of design §8, each taken from
// the package that owns it.
func createDefaultConfig() component.Config {
	engine := decision.DefaultConfig()
	return &Config{
		Enabled:        true,
		SampleInterval: sampler.DefaultInterval,
		Signal: SignalConfig{
			CPUSlowBeta: sampler.DefaultCPUSlowBeta,
			CPUFastBeta: sampler.DefaultCPUFastBeta,
		},
		Thresholds: ThresholdsConfig{
			CPU: slotConfig(engine.CPU),
			Mem: slotConfig(engine.Mem),
		},
		Rules: RulesConfig{
			ruleKeyDefault: {
				Enabled: ptrTo(builtinRule.Enabled),
				DropMin: ptrTo(builtinRule.DropMin),
				DropMax: ptrTo(builtinRule.DropMax),
			},
		},
		RetryAfter:   RetryAfterConfig{Min: middleware.DefaultRetryMin, Max: middleware.DefaultRetryMax},
		RecoveryRamp: engine.RecoveryRamp,
		Admission: AdmissionConfig{
			MaxInflightBytes: AutoInflightBudget(),
			UnknownSize:      middleware.DefaultUnknownSize,
			IdleTimeout:      middleware.DefaultIdleTimeout,
			PeerShare:        middleware.DefaultPeerShare,
			WaitTimeout:      middleware.DefaultBudgetWait,
		},
		Pacing:     PacingConfig{MaxHeld: defaultPacingMaxHeld},
		GoMemLimit: GoMemLimitConfig{Enabled: true, Share: gomemlimit.DefaultShare, HeapTarget: gomemlimit.DefaultHeapTarget},
		Queue:      QueueConfig{MaxWait: defaultQueueMaxWait, MaxHeld: defaultQueueMaxHeld},
		Status:     configoptional.Default(defaultStatusServerConfig()),
		// ReportStatus false: see the field.
		StaleAfterIntervals: defaultStaleAfterIntervals,
	}
}

func defaultStatusServerConfig() confighttp.ServerConfig {
	cfg := confighttp.NewDefaultServerConfig()
	cfg.NetAddr.Endpoint = defaultStatusEndpoint
	return cfg
}

// RuleFor returns the effective rule of signal s: its entry in rules over
// the default rule, field by field.
func (cfg *Config) RuleFor(s decision.Signal) Rule {
	return cfg.Rules[s.String()].over(cfg.Rules.defaultRule())
}

func (rs RulesConfig) defaultRule() Rule {
	return rs[ruleKeyDefault].over(builtinRule)
}

// over returns base with the fields r sets replaced.
func (r RuleConfig) over(base Rule) Rule {
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

// StaleAfter is the age after which a water level is stale, or 0 for never.
func (cfg *Config) StaleAfter() time.Duration {
	return time.Duration(cfg.StaleAfterIntervals) * cfg.SampleInterval
}

// Validate checks the top-level fields and what spans sections. Each
// section validates itself, and the collector's confmap.Validate calls
// them all, whether the throttle is enabled or not, so that a typo fails at
// start and not on the day the throttle is switched on.
func (cfg *Config) Validate() error {
	var errs []error
	if cfg.SampleInterval < minSampleInterval {
		errs = append(errs, fmt.Errorf("%w, got %v", errSampleInterval, cfg.SampleInterval))
	}
	if cfg.RecoveryRamp < 0 {
		errs = append(errs, fmt.Errorf("%w, got %v", errRecoveryRamp, cfg.RecoveryRamp))
	}
	// The server's own settings are validated by confighttp through
	// configoptional when the section is present.
	if cfg.Status.HasValue() && cfg.Status.Get().NetAddr.Endpoint == "" {
		errs = append(errs, errStatusEndpoint)
	}
	switch {
	case cfg.StaleAfterIntervals != 0 && cfg.StaleAfterIntervals < minStaleAfterIntervals:
		errs = append(errs, fmt.Errorf("%w, got %d", errStaleAfterIntervals, cfg.StaleAfterIntervals))
	case cfg.SampleInterval > 0 && int64(cfg.StaleAfterIntervals) > int64(math.MaxInt64/cfg.SampleInterval):
		errs = append(errs, fmt.Errorf("%w: %d intervals of %v overflow a duration", errStaleAfterOverflow, cfg.StaleAfterIntervals, cfg.SampleInterval))
	}
	return errors.Join(errs...)
}

// Validate checks the signal section.
func (c SignalConfig) Validate() error {
	var errs []error
	if !(c.CPUSlowBeta > 0 && c.CPUSlowBeta < 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errCPUSlowBeta, formatConfigFloat(c.CPUSlowBeta)))
	}
	if !(c.CPUFastBeta > 0 && c.CPUFastBeta < 1) {
		errs = append(errs, fmt.Errorf("%w, got %s", errCPUFastBeta, formatConfigFloat(c.CPUFastBeta)))
	}
	if !(c.FallbackCores >= 0) || math.IsInf(c.FallbackCores, 1) {
		errs = append(errs, fmt.Errorf("%w, got %s", errFallbackCores, formatConfigFloat(c.FallbackCores)))
	}
	if c.MemoryLimitMiB > maxMemoryLimitMiB {
		errs = append(errs, fmt.Errorf("%w, got %d", errMemoryLimitMiB, c.MemoryLimitMiB))
	}
	return errors.Join(errs...)
}

// Validate checks the bound of the memory slot; each slot checks its own
// lines. CPU is a share of the effective cores and can exceed 1 (CFS
// bursts, fallback_cores below the cores in use), so it has no upper bound.
func (c ThresholdsConfig) Validate() error {
	if m := c.Mem; m.Enabled && m.finite() && m.Hard > 1 {
		return fmt.Errorf("%w, got %s", errMemHardAboveOne, formatConfigFloat(m.Hard))
	}
	return nil
}

// Validate checks 0 < exit < enter < hard, breach_n >= 1 and max_shed in
// (0, 1] for an enabled slot. Comparisons are written so NaN fails them.
func (s SlotConfig) Validate() error {
	if !s.Enabled {
		return nil
	}
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"enter", s.Enter}, {"exit", s.Exit}, {"hard", s.Hard}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("%s %w, got %s", f.name, errNotFinite, formatConfigFloat(f.v)))
		}
	}
	if s.finite() {
		if s.Exit <= 0 {
			errs = append(errs, fmt.Errorf("%w, got %s", errExitNotAboveZero, formatConfigFloat(s.Exit)))
		}
		if s.Exit >= s.Enter {
			errs = append(errs, fmt.Errorf("%w, got %s and %s", errExitNotBelowEnter, formatConfigFloat(s.Exit), formatConfigFloat(s.Enter)))
		}
		if s.Enter >= s.Hard {
			errs = append(errs, fmt.Errorf("%w, got %s and %s", errEnterNotBelowHard, formatConfigFloat(s.Enter), formatConfigFloat(s.Hard)))
		}
	}
	if s.BreachN < 1 {
		errs = append(errs, fmt.Errorf("%w, got %d", errBreachN, s.BreachN))
	}
	if !(s.MaxShed > 0 && s.MaxShed <= 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errMaxShed, formatConfigFloat(s.MaxShed)))
	}
	return errors.Join(errs...)
}

func (s SlotConfig) finite() bool {
	for _, v := range []float64{s.Enter, s.Exit, s.Hard} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
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
	if c.Max < 0 {
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
	if !a.MaxInflightBytes.Off() {
		if a.UnknownSize == 0 {
			errs = append(errs, errUnknownSizeZero)
		} else if !a.MaxInflightBytes.Auto() && a.UnknownSize > a.MaxInflightBytes.Size() {
			errs = append(errs, fmt.Errorf("%w, got %v and %v", errUnknownSizeOverBudget, a.UnknownSize, a.MaxInflightBytes.Size()))
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
	if a.MaxInflightBytes.Size() > maxByteSize {
		errs = append(errs, fmt.Errorf("max_inflight_bytes %w, got %v", errSizeTooLarge, a.MaxInflightBytes.Size()))
	}
	if a.UnknownSize > maxByteSize {
		errs = append(errs, fmt.Errorf("unknown_size %w, got %v", errSizeTooLarge, a.UnknownSize))
	}
	return errors.Join(errs...)
}

// Validate checks the pacing section.
func (c PacingConfig) Validate() error {
	var errs []error
	if c.Delay < 0 || c.Delay > maxPacingDelay {
		errs = append(errs, fmt.Errorf("%w, got %v", errPacingDelay, c.Delay))
	}
	if c.MaxHeld < 0 {
		errs = append(errs, fmt.Errorf("%w, got %d", errPacingMaxHeld, c.MaxHeld))
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
