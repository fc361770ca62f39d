// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"math"
	"path"
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
)

// Defaults and bounds of the configuration (design §8); the comments say
// where a bound comes from.
const (
	defaultSampleInterval = 250 * time.Millisecond
	// Below 10ms the sampler's own file reads become a noticeable share of a
	// core, and CPU windows get too short to measure against CFS periods.
	minSampleInterval = 10 * time.Millisecond

	defaultCPUSlowBeta = 0.95
	defaultCPUFastBeta = 0.7

	defaultRetryAfterMax = 30 * time.Second
	defaultRecoveryRamp  = 5 * time.Second

	// defaultStaleAfterIntervals is 5s at the default 250ms interval. A
	// stale level falls back to admitting, and the sampler goroutine is most
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

	defaultUnknownSize ByteSize = 1 << 20 // 1 MiB

	// The admission defaults are the middleware's (see their comments
	// there for why). maxWaitTimeout bounds how long a body may hold its
	// handler and stop admissions while it waits for the budget.
	defaultIdleTimeout = middleware.DefaultIdleTimeout
	minIdleTimeout     = time.Second
	defaultPeerShare   = middleware.DefaultPeerShare
	defaultWaitTimeout = middleware.DefaultBudgetWait
	maxWaitTimeout     = 10 * time.Second

	// Pacing is off by default (see PacingConfig). maxPacingDelay bounds
	// how long a rejected client and a shutdown wait on a held request.
	// 512 held requests cost about 10 MiB (goroutine and connection
	// buffers).
	maxPacingDelay       = 10 * time.Second
	defaultPacingMaxHeld = 512

	// autoBudgetDivisor: "auto" never reserves more than memLimit/12
	// (8.3%) for the bytes of admitted, unfinished requests: every admitted
	// byte costs several while it is read and decoded, so the budget can pin
	// close to half the limit in the worst case, which still leaves the
	// pipeline and the Go runtime their share.
	autoBudgetDivisor = 12
	// autoBudgetPerCore: "auto" never reserves more than this per effective
	// core either. The work in progress a CPU-bound collector needs to keep
	// its cores busy grows with its cores, not its memory; beyond it,
	// admitted requests only wait for the CPU while they hold memory and
	// take CPU from the exporters that drain the pipeline (docs/design.md,
	// "Admission budget", has the fleet measurements behind the figure).
	autoBudgetPerCore = 10 << 20
	// minAutoBudget: a budget is always at least one ordinary OTLP batch
	// (the SDK exporters' default is 1 MiB); a larger request runs alone.
	minAutoBudget = 1 << 20
	// maxAutoBudget: above 256 MiB the budget no longer bounds a burst
	// between two samples in any useful way; the state machines do.
	maxAutoBudget = 256 << 20
	// noLimitAutoBudget caps "auto" when there is no memory limit to take a
	// share of (no cgroup limit, no signal.memory_limit_mib): the budget of
	// a ~384 MiB container.
	noLimitAutoBudget = 32 << 20

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

// builtinRule is the rule of every signal when rules says nothing: every
// signal is throttled, from no drop at the enter line to dropping all at the
// hard line.
var builtinRule = Rule{Enabled: true, DropMin: 0, DropMax: 1}

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
	Rules map[string]RuleConfig `mapstructure:"rules"`

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

// Rule is a rule with every field resolved.
type Rule struct {
	Enabled bool
	DropMin float64
	DropMax float64
}

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
// uncompressed bodies (measured: rejections at 2x overload from 0.34 to 0.08
// of a core), but held rejections occupy the request slots of clients that
// share them between signals, exempt ones included, and the OTLP exporters
// compress (and honour Retry-After) by default.
type PacingConfig struct {
	// Delay is how long a rejection is held, after its body has been read
	// and discarded, before the 429 is written. Default 0s = off; 1s is a
	// good start; at most 10s. A held request also delays the receiver's
	// shutdown by up to this long.
	Delay time.Duration `mapstructure:"delay"`
	// MaxHeld bounds the rejections held at once (each holds a goroutine
	// and a connection, about 20 KiB, plus a 16 KiB buffer while its body
	// is read); beyond it they are answered at once. Default 512; 0 = off.
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
	_ component.Config          = (*Config)(nil)
	_ confmap.Validator         = (*Config)(nil)
	_ confmap.ScalarUnmarshaler = (*ByteSize)(nil)
	_ confmap.ScalarUnmarshaler = (*InflightBudget)(nil)
)

func ptrTo[T any](v T) *T { return &v }

// createDefaultConfig returns the defaults of design §8.
func createDefaultConfig() component.Config {
	return &Config{
		Enabled:        true,
		SampleInterval: defaultSampleInterval,
		Signal: SignalConfig{
			CPUSlowBeta: defaultCPUSlowBeta,
			CPUFastBeta: defaultCPUFastBeta,
		},
		Thresholds: ThresholdsConfig{
			CPU: SlotConfig{Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachN: 3, MaxShed: decision.DefaultCPUMaxShed},
			// breach_n 1: memory meets the OOM killer, which is final; CPU
			// only gets throttled by CFS.
			Mem: SlotConfig{Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachN: 1, MaxShed: 1},
		},
		Rules: map[string]RuleConfig{
			ruleKeyDefault: {
				Enabled: ptrTo(builtinRule.Enabled),
				DropMin: ptrTo(builtinRule.DropMin),
				DropMax: ptrTo(builtinRule.DropMax),
			},
		},
		RetryAfter:   RetryAfterConfig{Min: 0, Max: defaultRetryAfterMax},
		RecoveryRamp: defaultRecoveryRamp,
		Admission: AdmissionConfig{
			MaxInflightBytes: AutoInflightBudget(),
			UnknownSize:      defaultUnknownSize,
			IdleTimeout:      defaultIdleTimeout,
			PeerShare:        defaultPeerShare,
			WaitTimeout:      defaultWaitTimeout,
		},
		Pacing:     PacingConfig{MaxHeld: defaultPacingMaxHeld},
		GoMemLimit: GoMemLimitConfig{Enabled: true, Share: gomemlimit.DefaultShare},
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
	return cfg.Rules[s.String()].over(cfg.defaultRule())
}

func (cfg *Config) defaultRule() Rule {
	return cfg.Rules[ruleKeyDefault].over(builtinRule)
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

// Validate checks the whole configuration, whether enabled or not, and
// returns every problem found, each naming its field by its full path.
func (cfg *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if cfg.SampleInterval < minSampleInterval {
		add("sample_interval must be >= %v, got %v", minSampleInterval, cfg.SampleInterval)
	}

	// Signal.
	for _, b := range []struct {
		key string
		v   float64
	}{
		{"signal.cpu_slow_beta", cfg.Signal.CPUSlowBeta},
		{"signal.cpu_fast_beta", cfg.Signal.CPUFastBeta},
	} {
		if !(b.v > 0 && b.v < 1) { // also rejects NaN
			add("%s must be in (0, 1), got %s", b.key, formatConfigFloat(b.v))
		}
	}
	if !(cfg.Signal.FallbackCores >= 0) || math.IsInf(cfg.Signal.FallbackCores, 1) {
		add("signal.fallback_cores must be a number >= 0, got %s", formatConfigFloat(cfg.Signal.FallbackCores))
	}
	if cfg.Signal.MemoryLimitMiB > maxMemoryLimitMiB {
		add("signal.memory_limit_mib must be <= %d, got %d", uint64(maxMemoryLimitMiB), cfg.Signal.MemoryLimitMiB)
	}

	// Thresholds. Memory is a share of the limit: above 1 the kernel's OOM
	// killer comes first, so a hard line over 1 would never open. CPU is a
	// share of the effective cores and can exceed 1 (CFS bursts,
	// fallback_cores below the cores in use), so it has no upper bound.
	errs = append(errs, validateSlot("thresholds.cpu", cfg.Thresholds.CPU, math.Inf(1))...)
	errs = append(errs, validateSlot("thresholds.mem", cfg.Thresholds.Mem, 1)...)

	// Rules.
	errs = append(errs, cfg.validateRules()...)

	// Rejection and recovery.
	if cfg.RetryAfter.Min < 0 {
		add("retry_after.min must be >= 0, got %v", cfg.RetryAfter.Min)
	}
	if cfg.RetryAfter.Max < 0 {
		add("retry_after.max must be >= 0, got %v", cfg.RetryAfter.Max)
	}
	if cfg.RetryAfter.Min > cfg.RetryAfter.Max {
		add("retry_after.min must be <= retry_after.max, got %v and %v", cfg.RetryAfter.Min, cfg.RetryAfter.Max)
	}
	if cfg.RecoveryRamp < 0 {
		add("recovery_ramp must be >= 0, got %v", cfg.RecoveryRamp)
	}

	// Admission. With the budget on, a request of unknown size must reserve
	// something, and must fit in a fixed budget, or every chunked request
	// would be rejected.
	if !cfg.Admission.MaxInflightBytes.Off() {
		if cfg.Admission.UnknownSize == 0 {
			add("admission.unknown_size must be > 0 when admission.max_inflight_bytes is not 0")
		} else if !cfg.Admission.MaxInflightBytes.Auto() && cfg.Admission.UnknownSize > cfg.Admission.MaxInflightBytes.Size() {
			add("admission.unknown_size must be <= admission.max_inflight_bytes, got %v and %v",
				cfg.Admission.UnknownSize, cfg.Admission.MaxInflightBytes.Size())
		}
	}
	errs = append(errs, cfg.Admission.validateLimits()...)

	// Pacing.
	if cfg.Pacing.Delay < 0 || cfg.Pacing.Delay > maxPacingDelay {
		add("pacing.delay must be between 0s and %v, got %v", maxPacingDelay, cfg.Pacing.Delay)
	}
	if cfg.Pacing.MaxHeld < 0 {
		add("pacing.max_held must be >= 0, got %d", cfg.Pacing.MaxHeld)
	}

	// Routes.
	errs = append(errs, validateRoutes(cfg.Routes)...)

	// Status. The server's own settings are validated by confighttp through
	// configoptional when the section is present.
	if cfg.Status.HasValue() && cfg.Status.Get().NetAddr.Endpoint == "" {
		add("status.endpoint must not be empty")
	}

	switch {
	case cfg.StaleAfterIntervals != 0 && cfg.StaleAfterIntervals < minStaleAfterIntervals:
		add("stale_after_intervals must be 0 (never) or >= %d, got %d", minStaleAfterIntervals, cfg.StaleAfterIntervals)
	case cfg.SampleInterval > 0 && int64(cfg.StaleAfterIntervals) > int64(math.MaxInt64/cfg.SampleInterval):
		add("stale_after_intervals is too large: %d intervals of %v overflow a duration", cfg.StaleAfterIntervals, cfg.SampleInterval)
	}

	return errors.Join(errs...)
}

// validateLimits checks the settings that keep slow and greedy clients
// from holding the admission budget.
func (a AdmissionConfig) validateLimits() []error {
	var errs []error
	if a.IdleTimeout != 0 && a.IdleTimeout < minIdleTimeout {
		errs = append(errs, fmt.Errorf("admission.idle_timeout must be 0 (off) or >= %v, got %v", minIdleTimeout, a.IdleTimeout))
	}
	if !(a.PeerShare > 0 && a.PeerShare <= 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("admission.peer_share must be in (0, 1], got %s", formatConfigFloat(a.PeerShare)))
	}
	if a.WaitTimeout < 0 || a.WaitTimeout > maxWaitTimeout {
		errs = append(errs, fmt.Errorf("admission.wait_timeout must be between 0s and %v, got %v", maxWaitTimeout, a.WaitTimeout))
	}
	// Sizes are byte counts in int64 arithmetic: past 2^63 they would wrap
	// negative and turn the budget off, so bound them well below.
	if a.MaxInflightBytes.Size() > maxByteSize {
		errs = append(errs, fmt.Errorf("admission.max_inflight_bytes must be at most %v, got %v", maxByteSize, a.MaxInflightBytes.Size()))
	}
	if a.UnknownSize > maxByteSize {
		errs = append(errs, fmt.Errorf("admission.unknown_size must be at most %v, got %v", maxByteSize, a.UnknownSize))
	}
	return errs
}

// maxByteSize bounds admission sizes: 1 TiB, far above any container's
// memory.
const maxByteSize = ByteSize(1 << 40)

// validateSlot checks 0 < exit < enter < hard <= maxHard and breach_n >= 1
// for an enabled slot. Comparisons are written so NaN fails them.
func validateSlot(key string, s SlotConfig, maxHard float64) []error {
	if !s.Enabled {
		return nil
	}
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	finite := true
	for _, f := range []struct {
		name string
		v    float64
	}{{"enter", s.Enter}, {"exit", s.Exit}, {"hard", s.Hard}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			add("%s.%s must be a finite number, got %s", key, f.name, formatConfigFloat(f.v))
			finite = false
		}
	}
	if finite {
		if s.Exit <= 0 {
			add("%s.exit must be > 0, got %s", key, formatConfigFloat(s.Exit))
		}
		if s.Exit >= s.Enter {
			add("%s.exit must be < %s.enter, got %s and %s", key, key, formatConfigFloat(s.Exit), formatConfigFloat(s.Enter))
		}
		if s.Enter >= s.Hard {
			add("%s.enter must be < %s.hard, got %s and %s", key, key, formatConfigFloat(s.Enter), formatConfigFloat(s.Hard))
		}
		if s.Hard > maxHard {
			add("%s.hard must be <= %s, got %s", key, formatConfigFloat(maxHard), formatConfigFloat(s.Hard))
		}
	}
	if s.BreachN < 1 {
		add("%s.breach_n must be >= 1, got %d", key, s.BreachN)
	}
	if !(s.MaxShed > 0 && s.MaxShed <= 1) {
		add("%s.max_shed must be in (0, 1], got %s", key, formatConfigFloat(s.MaxShed))
	}
	return errs
}

func (cfg *Config) validateRules() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	keys := make([]string, 0, len(cfg.Rules))
	for k := range cfg.Rules {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(ruleKeys, k) {
			add("rules.%s: unknown signal, want one of %s", k, strings.Join(ruleKeys, ", "))
		}
	}

	for _, k := range ruleKeys {
		r, ok := cfg.Rules[k]
		if !ok {
			continue
		}
		inRange := true
		for _, f := range []struct {
			name string
			v    *float64
		}{{"drop_min", r.DropMin}, {"drop_max", r.DropMax}} {
			if f.v != nil && !(*f.v >= 0 && *f.v <= 1) { // also rejects NaN
				add("rules.%s.%s must be in [0, 1], got %s", k, f.name, formatConfigFloat(*f.v))
				inRange = false
			}
		}
		// The order is checked on the effective rule, but only where this
		// entry sets one of the two: a bad default is reported once, at
		// rules.default, not again for every signal inheriting it.
		if !inRange || (r.DropMin == nil && r.DropMax == nil) {
			continue
		}
		base := builtinRule
		if k != ruleKeyDefault {
			base = cfg.defaultRule()
		}
		eff := r.over(base)
		if eff.DropMin > eff.DropMax {
			var inherited string
			switch {
			case r.DropMin == nil:
				inherited = " (drop_min inherited)"
			case r.DropMax == nil:
				inherited = " (drop_max inherited)"
			}
			add("rules.%s.drop_min must be <= rules.%s.drop_max, got %s and %s%s",
				k, k, formatConfigFloat(eff.DropMin), formatConfigFloat(eff.DropMax), inherited)
		}
	}
	return errs
}

func validateRoutes(rc RoutesConfig) []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	checkSignal := func(key, sig string) {
		if _, ok := decision.ParseSignal(sig); !ok {
			add("%s: unknown signal %q, want one of %s", key, sig, strings.Join(routeSignalNames, ", "))
		}
	}

	for _, p := range sortedRouteKeys(rc.HTTP) {
		key := "routes.http." + p
		switch {
		case !strings.HasPrefix(p, "/"):
			add("%s: path must start with \"/\"", key)
		case strings.ContainsAny(p, "?#"):
			add("%s: path must not hold a query or fragment", key)
		case path.Clean(p) != p:
			// Requests are matched after cleaning, so an unclean route
			// could never match.
			add("%s: path must be clean, want %q", key, path.Clean(p))
		}
		checkSignal(key, rc.HTTP[p])
	}
	for _, m := range sortedRouteKeys(rc.GRPC) {
		key := "routes.grpc." + m
		if !isFullMethod(m) {
			add("%s: want a full method name like \"/pkg.Service/Method\"", key)
		}
		checkSignal(key, rc.GRPC[m])
	}
	return errs
}

// isFullMethod reports whether m looks like a gRPC full method name,
// "/package.Service/Method", made of protobuf identifier characters (the
// package is optional in gRPC, so "/Service/Method" is accepted too).
func isFullMethod(m string) bool {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return false
	}
	service, method, ok := strings.Cut(rest, "/")
	if !ok || service == "" || method == "" || strings.Contains(method, "/") {
		return false
	}
	if strings.HasPrefix(service, ".") || strings.HasSuffix(service, ".") || strings.Contains(service, "..") {
		return false
	}
	ident := func(s string, dots bool) bool {
		for _, c := range s {
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
			case c == '.' && dots:
			default:
				return false
			}
		}
		return true
	}
	return ident(service, true) && ident(method, false)
}

func sortedRouteKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func formatConfigFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// ByteSize is a number of bytes. In configuration it is an integer (bytes)
// or a string: a number with an optional unit, decimal (B, KB, MB, GB, TB;
// also k, M, G, T) or binary (KiB, MiB, GiB, TiB; also Ki, Mi, Gi, Ti as in
// Kubernetes), case-insensitive, for example "1MiB", "64MB", "1.5GiB".
// A fraction must come to a whole number of bytes.
type ByteSize uint64

// The binary units.
const (
	KiB ByteSize = 1 << 10
	MiB ByteSize = 1 << 20
	GiB ByteSize = 1 << 30
	TiB ByteSize = 1 << 40
)

var sizeUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "ki": 1 << 10, "kib": 1 << 10,
	"m": 1e6, "mb": 1e6, "mi": 1 << 20, "mib": 1 << 20,
	"g": 1e9, "gb": 1e9, "gi": 1 << 30, "gib": 1 << 30,
	"t": 1e12, "tb": 1e12, "ti": 1 << 40, "tib": 1 << 40,
}

// ParseByteSize parses a size such as "1048576", "1MiB", "64MB" or "1.5GiB".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("invalid size %q: want a number of bytes or a size like 24MiB, 64MB or 1GiB", s)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil || n > math.MaxUint64/mult {
			return 0, fmt.Errorf("invalid size %q: too large", s)
		}
		return ByteSize(n * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: want a number of bytes or a size like 24MiB, 64MB or 1GiB", s)
	}
	v := f * float64(mult)
	if v >= math.MaxUint64 { // 2^64 as a float64
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	return ByteSize(v), nil
}

// String formats b in the largest binary unit that divides it exactly, or in
// bytes ("0", "1MiB", "1536KiB", "1000B"). ParseByteSize reads it back.
func (b ByteSize) String() string {
	n := uint64(b)
	if n == 0 {
		return "0"
	}
	for _, u := range []struct {
		size uint64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n%u.size == 0 {
			return strconv.FormatUint(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// MarshalText implements encoding.TextMarshaler.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *ByteSize) UnmarshalText(text []byte) error {
	v, err := ParseByteSize(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// UnmarshalScalar implements confmap.ScalarUnmarshaler so that a plain YAML
// number is read exactly (a negative or fractional number is an error, not
// truncated) and strings go through UnmarshalText.
func (b *ByteSize) UnmarshalScalar(sv confmap.ScalarValue) error {
	switch raw := sv.GetRaw().(type) {
	case *ByteSize: // already decoded by UnmarshalText
		*b = *raw
		return nil
	case ByteSize:
		*b = raw
		return nil
	}
	n, err := sizeFromScalar(sv.GetRaw())
	if err != nil {
		return err
	}
	*b = n
	return nil
}

// sizeFromScalar reads a size from a decoded YAML scalar.
func sizeFromScalar(raw any) (ByteSize, error) {
	switch v := raw.(type) {
	case string:
		return ParseByteSize(v)
	case int:
		return sizeFromInt(int64(v))
	case int64:
		return sizeFromInt(v)
	case int32:
		return sizeFromInt(int64(v))
	case uint:
		return ByteSize(v), nil
	case uint64:
		return ByteSize(v), nil
	case uint32:
		return ByteSize(v), nil
	case float64:
		if !(v >= 0) || v >= math.MaxUint64 || v != math.Trunc(v) {
			return 0, fmt.Errorf("invalid size %s: want a whole number of bytes >= 0", formatConfigFloat(v))
		}
		return ByteSize(v), nil
	case nil:
		return 0, errors.New("invalid size: empty value")
	default:
		return 0, fmt.Errorf("invalid size %v (%T): want a number of bytes or a size like 24MiB", raw, raw)
	}
}

func sizeFromInt(v int64) (ByteSize, error) {
	if v < 0 {
		return 0, fmt.Errorf("invalid size %d: must be >= 0", v)
	}
	return ByteSize(v), nil
}

// InflightBudget is admission.max_inflight_bytes: "auto", 0 (off) or a
// size. The zero value is off.
type InflightBudget struct {
	auto bool
	size ByteSize
}

// AutoInflightBudget is the "auto" budget, a share of the memory limit.
func AutoInflightBudget() InflightBudget { return InflightBudget{auto: true} }

// FixedInflightBudget is a budget of n bytes; 0 is off.
func FixedInflightBudget(n ByteSize) InflightBudget { return InflightBudget{size: n} }

// Auto reports whether the budget is "auto".
func (b InflightBudget) Auto() bool { return b.auto }

// Off reports whether the budget is disabled (0).
func (b InflightBudget) Off() bool { return !b.auto && b.size == 0 }

// Size is the fixed size of the budget; 0 when auto or off.
func (b InflightBudget) Size() ByteSize { return b.size }

// ResolveBudget returns the budget in bytes for a memory limit of memLimit
// bytes (0 = no limit) and cores effective cores (<= 0 = unknown), or 0 when
// the budget is off. "auto" is the smaller of memLimit/12 (32 MiB without a
// limit) and 10 MiB per core, within [1 MiB, 256 MiB].
func (b InflightBudget) ResolveBudget(memLimit uint64, cores float64) uint64 {
	if !b.auto {
		return uint64(b.size)
	}
	byMem := uint64(noLimitAutoBudget)
	if memLimit > 0 {
		byMem = memLimit / autoBudgetDivisor
	}
	byCPU := uint64(maxAutoBudget)
	if cores > 0 && !math.IsInf(cores, 0) {
		byCPU = uint64(min(cores*autoBudgetPerCore, maxAutoBudget))
	}
	return min(max(min(byMem, byCPU), minAutoBudget), maxAutoBudget)
}

// String is "auto", "0" or the size.
func (b InflightBudget) String() string {
	if b.auto {
		return "auto"
	}
	return b.size.String()
}

// MarshalText implements encoding.TextMarshaler.
func (b InflightBudget) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: "auto" or a size.
func (b *InflightBudget) UnmarshalText(text []byte) error {
	if strings.EqualFold(strings.TrimSpace(string(text)), "auto") {
		*b = AutoInflightBudget()
		return nil
	}
	n, err := ParseByteSize(string(text))
	if err != nil {
		return fmt.Errorf("%w; or \"auto\", or 0 for off", err)
	}
	*b = FixedInflightBudget(n)
	return nil
}

// UnmarshalScalar implements confmap.ScalarUnmarshaler: besides the strings
// of UnmarshalText it takes plain YAML numbers, which confmap would
// otherwise try to decode into the struct.
func (b *InflightBudget) UnmarshalScalar(sv confmap.ScalarValue) error {
	switch raw := sv.GetRaw().(type) {
	case *InflightBudget: // already decoded by UnmarshalText
		*b = *raw
		return nil
	case InflightBudget:
		*b = raw
		return nil
	case string:
		return b.UnmarshalText([]byte(raw))
	}
	n, err := sizeFromScalar(sv.GetRaw())
	if err != nil {
		return fmt.Errorf("%w; or \"auto\", or 0 for off", err)
	}
	*b = FixedInflightBudget(n)
	return nil
}
