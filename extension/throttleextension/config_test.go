// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/downstream"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/softlimit"
	"github.com/otelthrottle/throttle/internal/statuspage"
)

// defaultConfigWith returns the default configuration changed by edit.
func defaultConfigWith(edit func(*Config)) *Config {
	cfg := createDefaultConfig().(*Config)
	edit(cfg)
	return cfg
}

func statusAt(endpoint string) configoptional.Optional[statuspage.Config] {
	s := statuspage.DefaultConfig()
	s.NetAddr.Endpoint = endpoint
	return configoptional.Some(s)
}

func ptrTo[T any](v T) *T { return &v }

// loadConfig unmarshals the configuration named id in testdata/config.yaml
// over the default one, as the collector does.
func loadConfig(t *testing.T, id component.ID) (*Config, error) {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)
	sub, err := cm.Sub(id.String())
	require.NoError(t, err)
	cfg := createDefaultConfig().(*Config)
	return cfg, sub.Unmarshal(cfg)
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		id       component.ID
		expected *Config
	}{
		{
			id:       component.NewID(metadata.Type),
			expected: createDefaultConfig().(*Config),
		},
		{
			id: component.NewIDWithName(metadata.Type, "full"),
			expected: &Config{
				Settings: runner.Settings{
					Enabled:       true,
					ObserveOnly:   true,
					CheckInterval: 100 * time.Millisecond,
					StaleAfter:    2 * time.Second,
					RecoveryRamp:  2 * time.Second,
					ReportStatus:  true,
				},
				CPU: runner.CPUConfig{
					Lines:     decision.Lines{Enabled: true, Enter: 0.75, Exit: 0.65, Hard: 0.95, BreachDuration: 400 * time.Millisecond, MaxShed: 0.5},
					CPUConfig: sampler.CPUConfig{SlowWindow: 949100 * time.Microsecond, FastWindow: 144300 * time.Microsecond, FallbackCores: 1.5},
				},
				Memory: runner.MemoryConfig{
					Lines:        decision.Lines{Enabled: false, Enter: 0.8, Exit: 0.7, Hard: 0.9, BreachDuration: 200 * time.Millisecond, MaxShed: 0.9},
					MemoryConfig: sampler.MemoryConfig{LimitMiB: 512},
					SoftLimit:    softlimit.Config{Enabled: false, Share: 0.7, HeapTarget: 0.4},
				},
				Downstream: downstream.Config{
					Lines:     decision.Lines{Enabled: true, Enter: 0.6, Exit: 0.4, Hard: 0.9, BreachDuration: 500 * time.Millisecond, MaxShed: 0.8},
					Endpoint:  "http://127.0.0.1:18888/metrics",
					Interval:  time.Second,
					Exporters: []string{"otlp_grpc/backend", "otlp_http"},
				},
				Rules: decision.RulesConfig{
					"default":  {Enabled: ptrTo(true), DropMin: ptrTo(0.1), DropMax: ptrTo(0.9)},
					"traces":   {DropMax: ptrTo(0.5)},
					"metrics":  {Enabled: ptrTo(false)},
					"logs":     {DropMin: ptrTo(0.2)},
					"profiles": {Enabled: ptrTo(true), DropMin: ptrTo(0.0), DropMax: ptrTo(0.0)},
				},
				RetryAfter: middleware.RetryConfig{Min: time.Second, Max: 10 * time.Second},
				Admission: admission.Config{
					MaxInflightBytes:   admission.FixedInflightBudget(24 * admission.MiB),
					UnknownSize:        512 * admission.KiB,
					IdleTimeout:        5 * time.Second,
					WaitTimeout:        2 * time.Second,
					GRPCMaxMessageSize: 8 * admission.MiB,
					Fairness: admission.FairnessConfig{
						Key: admission.KeyHeader, Header: "X-Scope-OrgID", Share: 0.25,
						Weights: map[string]float64{"tenant-a": 4}, TrustedProxies: []string{"10.0.0.0/8"},
						ForwardedHeader: admission.DefaultForwardedHeader,
					},
				},
				Hold:   admission.HoldConfig{MaxWait: 2 * time.Second, MaxRequests: 32},
				Tarpit: middleware.TarpitConfig{Delay: 250 * time.Millisecond, MaxRequests: 64},
				Routes: middleware.RoutesConfig{
					HTTP: map[string]string{
						"/prometheus/write": "metrics",
						"/api/v2/spans":     "traces",
						"/loki/api/v1/push": "logs",
					},
					GRPC: map[string]string{"/my.pkg.Service/Push": "logs"},
				},
				Status: statusAt("127.0.0.1:55681"),
			},
		},
		{
			id: component.NewIDWithName(metadata.Type, "benchmark"),
			expected: defaultConfigWith(func(c *Config) {
				c.CPU.Enter, c.CPU.Exit, c.CPU.Hard = 0.85, 0.70, 1.20
				c.CPU.SlowWindow, c.CPU.FastWindow = 4874*time.Millisecond, 700900*time.Microsecond
				c.CPU.FallbackCores = 1
				c.Memory.Enter, c.Memory.Exit, c.Memory.Hard = 0.70, 0.60, 0.80
				c.Rules = decision.RulesConfig{
					// A map entry is decoded afresh: enabled, not written,
					// stays nil and is inherited (true).
					"default": {DropMin: ptrTo(0.0), DropMax: ptrTo(0.2)},
					"metrics": {Enabled: ptrTo(false)},
				}
			}),
		},
		{
			id:       component.NewIDWithName(metadata.Type, "disabled"),
			expected: defaultConfigWith(func(c *Config) { c.Enabled = false }),
		},
		{
			id: component.NewIDWithName(metadata.Type, "status_default"),
			expected: defaultConfigWith(func(c *Config) {
				c.Status = configoptional.Some(statuspage.DefaultConfig())
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "status_off"),
			expected: defaultConfigWith(func(c *Config) {
				c.Status = configoptional.None[statuspage.Config]()
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "sizes_int"),
			expected: defaultConfigWith(func(c *Config) {
				c.Admission.MaxInflightBytes = admission.FixedInflightBudget(32 * admission.MiB)
				c.Admission.UnknownSize = 64 * admission.KiB
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "sizes_units"),
			expected: defaultConfigWith(func(c *Config) {
				c.Admission.MaxInflightBytes = admission.FixedInflightBudget(64_000_000)
				c.Admission.UnknownSize = 1536
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "budget_off"),
			expected: defaultConfigWith(func(c *Config) {
				c.Admission.MaxInflightBytes = admission.FixedInflightBudget(0)
				c.Admission.UnknownSize = 0
			}),
		},
		{
			id:       component.NewIDWithName(metadata.Type, "budget_auto"),
			expected: createDefaultConfig().(*Config),
		},
		{
			id: component.NewIDWithName(metadata.Type, "admission_limits_off"),
			expected: defaultConfigWith(func(c *Config) {
				c.Admission.IdleTimeout = 0
				c.Admission.Fairness.Share = 1
				c.Admission.WaitTimeout = 0
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "cpu_off"),
			expected: defaultConfigWith(func(c *Config) {
				c.CPU.Enabled, c.CPU.Enter, c.CPU.Exit, c.CPU.Hard, c.CPU.BreachDuration = false, 0, 0, 0, -time.Second
			}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			cfg, err := loadConfig(t, tt.id)
			require.NoError(t, err)
			assert.NoError(t, confmap.Validate(cfg))
			assert.Equal(t, tt.expected, cfg)
		})
	}
}

// fieldError is an error Validate must give, and the text of the
// collector's message that names its field. err is nil for an error of a
// section another package owns: its tests check the error itself.
type fieldError struct {
	err   error
	field string
}

// requireInvalid checks err, from confmap.Validate, against want: every
// error is there, as the package's error value, with the text naming its
// field (confmap.Validate puts the section's path before the section's
// first error only).
func requireInvalid(t *testing.T, want []fieldError, err error) {
	t.Helper()
	require.Error(t, err)
	for _, w := range want {
		if w.err != nil { // the errors of other packages' sections are theirs to check
			require.ErrorIs(t, err, w.err)
		}
		assert.Contains(t, err.Error(), w.field)
	}
	assert.Len(t, strings.Split(err.Error(), "\n"), len(want), "one line per error: %v", err)
}

func TestLoadConfigInvalid(t *testing.T) {
	t.Parallel()
	tests := map[string][]fieldError{
		"disabled_invalid":             {{nil, "cpu: exit must be < enter, got 0.95 and 0.9"}},
		"tarpit_delay_negative":        {{middleware.ErrTarpitDelay, "tarpit: delay"}},
		"tarpit_delay_too_long":        {{middleware.ErrTarpitDelay, "tarpit: delay"}},
		"tarpit_max_requests_negative": {{middleware.ErrTarpitMaxRequests, "tarpit: max_requests"}},
		"cpu_exit_ge_enter":            {{nil, "cpu: exit"}},
		"cpu_enter_ge_hard":            {{nil, "cpu: enter"}},
		"cpu_percent": {
			{nil, "cpu: enter must be <= 2: the CPU lines are a share of the effective cores (0.9 is 90%), not a percent, got 90"},
			{nil, "\nexit must be <= 2"},
			{nil, "\nhard must be <= 2"},
		},
		"memory_exit_zero":     {{nil, "memory: exit"}},
		"memory_hard_over_one": {{nil, "memory: hard must be <= 1, got 1.05"}},
		"downstream_invalid": {
			{nil, "downstream: hard must be <= 1: the downstream lines are a share of the queue's capacity (0.8 is 80%), got 80"},
			{nil, `endpoint must be an http:// or https:// URL of the collector's own metrics, got "localhost:8888"`},
			{nil, "interval must be between 50ms and 5s, got 10ms"},
			{nil, `exporters: each entry must be an exporter's component ID (type[/name]), got "not an id"`},
		},
		"breach_duration_out_of_range": {
			{nil, "cpu: breach_duration must be between 0s and 10s, got 11s"},
			{nil, "memory: breach_duration must be between 0s and 2s, got -1ms"},
		},
		"max_shed_out_of_range": {
			{nil, "cpu: max_shed must be in (0, 1], got 0"},
			{nil, "memory: max_shed must be in (0, 1], got 1.5"},
		},
		"window_out_of_range": {
			{nil, "cpu: slow_window must be > 0 and <= 1m0s, got 2m0s"},
			{nil, "\nfast_window"},
		},
		"fallback_cores_negative": {{nil, "cpu: fallback_cores"}},
		"memory_limit_tiny":       {{nil, "memory: limit_mib must be 0 (the cgroup's limit) or >= 32"}},
		"check_interval_short":    {{nil, "check_interval must be between 10ms and 10s, got 5ms"}},
		"check_interval_long":     {{nil, "check_interval must be between 10ms and 10s, got 11s"}},
		"drop_out_of_range": {
			{nil, "rules::traces: drop_min"},
			{nil, "\ndrop_max"},
		},
		"drop_min_gt_max":           {{nil, "rules::logs: drop_min"}},
		"drop_min_gt_inherited_max": {{nil, "rules: traces: drop_min must be <= drop_max, got 0.5 and 0.3 (drop_max inherited from default)"}},
		"unknown_rule":              {{nil, `rules: unknown signal "tracez", want one of default, traces, metrics, logs, profiles`}},
		"retry_after_inverted":      {{middleware.ErrRetryAfterOrder, "retry_after: min must be <= max"}},
		"retry_after_negative":      {{middleware.ErrRetryAfterMin, "retry_after: min"}},
		"retry_after_too_long":      {{middleware.ErrRetryAfterMax, "retry_after: max must be between 0s and 1m0s"}},
		"recovery_ramp_negative":    {{nil, "recovery_ramp"}},
		"unknown_size_zero":         {{admission.ErrUnknownSizeZero, "admission: unknown_size"}},
		"unknown_size_over_budget":  {{admission.ErrUnknownSizeOverBudget, "admission: unknown_size must be <= max_inflight_bytes, got 2MiB and 1MiB"}},
		"admission_limits_invalid": {
			{admission.ErrIdleTimeout, "admission: idle_timeout"},
			{admission.ErrShare, "admission::fairness: share"},
			{admission.ErrWaitTimeout, "\nwait_timeout"},
		},
		"admission_limits_negative": {
			{admission.ErrIdleTimeout, "admission: idle_timeout"},
			{admission.ErrShare, "admission::fairness: share"},
			{admission.ErrWaitTimeout, "\nwait_timeout"},
		},
		"route_unknown_signal": {
			{middleware.ErrUnknownSignal, `routes: http "/x": unknown signal "foo", want one of traces, metrics, logs, profiles`},
			{middleware.ErrUnknownSignal, "\n" + `grpc "/a.B/C": unknown signal "default"`},
		},
		"route_bad_paths": {
			{middleware.ErrRouteUnclean, `routes: http "/a//b": path must be clean, want "/a/b"`},
			{middleware.ErrRouteQuery, "\n" + `http "/q?x=1"`},
			{middleware.ErrRouteNotRooted, "\n" + `http "x/y"`},
			{middleware.ErrRouteMethod, "\n" + `grpc "/pkg.Service/"`},
			{middleware.ErrRouteMethod, "\n" + `grpc "/x"`},
			{middleware.ErrRouteMethod, "\n" + `grpc "pkg.Service/Method"`},
		},
		"status_empty_endpoint":        {{nil, "status: endpoint"}},
		"stale_after_short":            {{nil, "stale_after must be 0 (never), or at least 1s and at least 2 × check_interval, got 500ms at a check_interval of 250ms"}},
		"stale_after_under_two_checks": {{nil, "got 1.5s at a check_interval of 1s"}},
		"heap_target_over_share":       {{nil, "memory::soft_limit: heap_target must be below share (or 0), got 0.6 and share 0.5"}},
		"hold_invalid": {
			{admission.ErrHoldMaxWait, "hold: max_wait must be between 0s and 30s, got 1m0s"},
			{admission.ErrHoldMaxRequests, "\nmax_requests must be between 0 and 4096"},
		},
		"many": {
			{nil, "check_interval"},
			{nil, "cpu: exit"},
			{nil, `rules: unknown signal "metricz"`},
		},
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, name))
			require.NoError(t, err)
			requireInvalid(t, want, confmap.Validate(cfg))
		})
	}
}

// TestConfigErrorsInOrder: the errors come in the order of the fields, and
// of the keys within a section, so the same configuration always prints
// the same message.
func TestConfigErrorsInOrder(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"many": strings.Join([]string{
			"check_interval must be between 10ms and 10s, got 0s",
			"cpu: exit must be < enter, got 0.95 and 0.9",
			`rules: unknown signal "metricz", want one of default, traces, metrics, logs, profiles`,
		}, "\n"),
		// confmap.Validate names the section once, before its first error.
		"route_bad_paths": strings.Join([]string{
			`routes: http "/a//b": path must be clean, want "/a/b"`,
			`http "/q?x=1": path must not hold a query or fragment`,
			`http "x/y": path must start with "/"`,
			`grpc "/pkg.Service/": want a full method name like "/pkg.Service/Method"`,
			`grpc "/x": want a full method name like "/pkg.Service/Method"`,
			`grpc "pkg.Service/Method": want a full method name like "/pkg.Service/Method"`,
		}, "\n"),
		"admission_limits_invalid": strings.Join([]string{
			"admission: idle_timeout must be 0 (off) or between 1s and 1m0s, got 500ms",
			"wait_timeout must be between 0s and 10s, got 11s",
			"admission::fairness: share must be in (0, 1], got 0",
		}, "\n"),
	} {
		cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, name))
		require.NoError(t, err)
		assert.EqualError(t, confmap.Validate(cfg), want, name)
	}
}

// TestLoadConfigDecodeErrors covers what fails before Validate: confmap
// rejects unknown keys and the size types reject what is not a size. These
// are the messages the collector prints (after its own prefix naming the
// component).
func TestLoadConfigDecodeErrors(t *testing.T) {
	t.Parallel()
	const prefix = "decoding failed due to the following error(s):\n\n"
	tests := []struct {
		name string
		want string
	}{
		{"unknown_key", "'throttleextension.Config' has invalid keys: check_intervall"},
		{"bad_size", `'admission.max_inflight_bytes' invalid size "24 MeB": want a number of bytes or a size like 24MiB, 64MB or 1GiB; or "auto", or 0 for off`},
		{"negative_size", `'admission.max_inflight_bytes' invalid size -1: must be >= 0; or "auto", or 0 for off`},
		{"fractional_size", `'admission.unknown_size' invalid size 1.5: want a whole number of bytes >= 0`},
		{"bad_unknown_size", `'admission.unknown_size' invalid size "auto": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(t, component.NewIDWithName(metadata.Type, tt.name))
			assert.EqualError(t, err, prefix+tt.want)
		})
	}
}

func TestCreateDefaultConfig(t *testing.T) {
	cfg := createDefaultConfig().(*Config)
	require.NoError(t, confmap.Validate(cfg))
	assert.True(t, cfg.Enabled)
	assert.Equal(t, 250*time.Millisecond, cfg.CheckInterval)
	// The documented values, whichever package owns them.
	assert.Equal(t, runner.CPUConfig{
		Lines:     decision.Lines{Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachDuration: 750 * time.Millisecond, MaxShed: 0.2},
		CPUConfig: sampler.CPUConfig{SlowWindow: 5 * time.Second, FastWindow: 700 * time.Millisecond},
	}, cfg.CPU)
	assert.Equal(t, runner.MemoryConfig{
		Lines:     decision.Lines{Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachDuration: 250 * time.Millisecond, MaxShed: 1},
		SoftLimit: softlimit.Config{Enabled: true, Share: 0.80, HeapTarget: 0.50},
	}, cfg.Memory)
	assert.Equal(t, middleware.RetryConfig{Min: time.Second, Max: 5 * time.Second}, cfg.RetryAfter)
	assert.Equal(t, 5*time.Second, cfg.RecoveryRamp)
	assert.Equal(t, middleware.TarpitConfig{MaxRequests: 512}, cfg.Tarpit)
	assert.Equal(t, admission.HoldConfig{MaxWait: 8 * time.Second, MaxRequests: 256}, cfg.Hold)
	assert.Equal(t, 5*time.Second, cfg.StaleAfter)
	assert.True(t, cfg.Admission.MaxInflightBytes.IsAuto())
	assert.Equal(t, admission.MiB, cfg.Admission.UnknownSize)
	assert.Equal(t, 10*time.Second, cfg.Admission.IdleTimeout)
	assert.Equal(t, 0.5, cfg.Admission.Fairness.Share)
	assert.Equal(t, time.Second, cfg.Admission.WaitTimeout)
	assert.False(t, cfg.Status.HasValue(), "the status page is off by default")
	assert.False(t, cfg.ReportStatus)
	for s := range decision.NumSignals {
		assert.Equal(t, decision.Rule{Enabled: true, DropMin: 0, DropMax: 1}, cfg.Rules.Rule(s), s.String())
	}
	// Two calls do not share state (maps, pointers).
	other := createDefaultConfig().(*Config)
	*other.Rules[decision.RuleKeyDefault].DropMax = 0.5
	assert.Equal(t, 1.0, cfg.Rules.Rule(decision.SignalTraces).DropMax)
}

func TestConfigRuleFor(t *testing.T) {
	t.Parallel()
	full, err := loadConfig(t, component.NewIDWithName(metadata.Type, "full"))
	require.NoError(t, err)
	assert.Equal(t, decision.Rule{Enabled: true, DropMin: 0.1, DropMax: 0.5}, full.Rules.Rule(decision.SignalTraces))
	assert.Equal(t, decision.Rule{Enabled: false, DropMin: 0.1, DropMax: 0.9}, full.Rules.Rule(decision.SignalMetrics))
	assert.Equal(t, decision.Rule{Enabled: true, DropMin: 0.2, DropMax: 0.9}, full.Rules.Rule(decision.SignalLogs))
	assert.Equal(t, decision.Rule{Enabled: true, DropMin: 0, DropMax: 0}, full.Rules.Rule(decision.SignalProfiles))

	bench, err := loadConfig(t, component.NewIDWithName(metadata.Type, "benchmark"))
	require.NoError(t, err)
	for s := range decision.NumSignals {
		want := decision.Rule{Enabled: s != decision.SignalMetrics, DropMin: 0, DropMax: 0.2}
		assert.Equal(t, want, bench.Rules.Rule(s), s.String())
	}
}

func TestConfigValidateNonFinite(t *testing.T) {
	t.Parallel()
	nan, inf := math.NaN(), math.Inf(1)
	cfg := defaultConfigWith(func(c *Config) {
		c.CPU.Hard = inf
		c.CPU.FallbackCores = inf
		c.Memory.Enter = nan
		c.Rules["traces"] = decision.RuleConfig{DropMax: ptrTo(nan)}
		c.Admission.Fairness.Share = nan
	})
	requireInvalid(t, []fieldError{
		{nil, "cpu: hard must be a finite number, got +Inf"},
		{nil, "\nfallback_cores must be a number >= 0, got +Inf"},
		{nil, "memory: enter must be a finite number, got NaN"},
		{nil, "rules::traces: drop_max must be in [0, 1], got NaN"},
		{admission.ErrShare, "admission::fairness: share must be in (0, 1], got NaN"},
	}, confmap.Validate(cfg))
}

func TestConfigValidateMemoryLimitOverflow(t *testing.T) {
	t.Parallel()
	cfg := defaultConfigWith(func(c *Config) { c.Memory.LimitMiB = 1 << 44 })
	requireInvalid(t, []fieldError{{nil, "memory: limit_mib must be <= 17592186044415, got 17592186044416"}},
		confmap.Validate(cfg))
}

func TestConfigValidateSizeBounds(t *testing.T) {
	t.Parallel()
	cfg := defaultConfigWith(func(c *Config) {
		c.Admission.MaxInflightBytes = admission.FixedInflightBudget(2 * admission.TiB)
		c.Admission.UnknownSize = 2 * admission.TiB
	})
	requireInvalid(t, []fieldError{
		{admission.ErrSizeTooLarge, "admission: max_inflight_bytes must be at most 1TiB, got 2TiB"},
		{admission.ErrSizeTooLarge, "\nunknown_size must be at most 1TiB, got 2TiB"},
	}, confmap.Validate(cfg))
}

func TestConfigValidateSections(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		edit func(*Config)
		want []fieldError
	}{
		"retry_after.max negative": {
			func(c *Config) { c.RetryAfter = middleware.RetryConfig{Min: -time.Second, Max: -time.Second} },
			[]fieldError{
				{middleware.ErrRetryAfterMin, "retry_after: min"},
				{middleware.ErrRetryAfterMax, "\nmax must be between 0s and 1m0s: a longer delay outlasts the clients' retry windows, got -1s"},
			},
		},
		"hold": {
			func(c *Config) { c.Hold = admission.HoldConfig{MaxWait: time.Minute, MaxRequests: -1} },
			[]fieldError{
				{admission.ErrHoldMaxWait, "hold: max_wait must be between 0s and 30s, got 1m0s"},
				{admission.ErrHoldMaxRequests, "\nmax_requests must be between 0 and 4096"},
			},
		},
		"tarpit": {
			func(c *Config) { c.Tarpit = middleware.TarpitConfig{Delay: time.Minute, MaxRequests: -1} },
			[]fieldError{
				{middleware.ErrTarpitDelay, "tarpit: delay must be between 0s and 10s, got 1m0s"},
				{middleware.ErrTarpitMaxRequests, "\nmax_requests must be >= 0, got -1"},
			},
		},
		"memory::soft_limit": {
			func(c *Config) { c.Memory.SoftLimit.Share, c.Memory.SoftLimit.HeapTarget = 1.5, 1 },
			[]fieldError{
				{nil, "memory::soft_limit: share must be in (0, 1], got 1.5"},
				{nil, "\nheap_target must be in [0, 1), got 1"},
			},
		},
		"memory::soft_limit heap_target": {
			func(c *Config) { c.Memory.SoftLimit.HeapTarget = -0.1 },
			[]fieldError{{nil, "memory::soft_limit: heap_target must be in [0, 1), got -0.1"}},
		},
		"heap_target equal to share": {
			func(c *Config) { c.Memory.SoftLimit.Share, c.Memory.SoftLimit.HeapTarget = 0.5, 0.5 },
			[]fieldError{{nil, "memory::soft_limit: heap_target must be below share (or 0), got 0.5 and share 0.5"}},
		},
		"heap_target 0 with any share": {
			func(c *Config) { c.Memory.SoftLimit.Share, c.Memory.SoftLimit.HeapTarget = 0.1, 0 },
			nil,
		},
		"memory limit at its minimum": {
			func(c *Config) { c.Memory.LimitMiB = 32 },
			nil,
		},
		"memory limit under its minimum": {
			func(c *Config) { c.Memory.LimitMiB = 31 },
			[]fieldError{{nil, "memory: limit_mib must be 0 (the cgroup's limit) or >= 32: a collector's own baseline fills a smaller limit past the hard line, a permanent Open, got 31"}},
		},
		"CPU lines at their bound": {
			func(c *Config) { c.CPU.Enter, c.CPU.Exit, c.CPU.Hard = 1.5, 1, 2 },
			nil,
		},
		"a disabled CPU slot's lines are not bounded": {
			func(c *Config) { c.CPU.Enabled, c.CPU.Enter, c.CPU.Exit, c.CPU.Hard = false, 90, 80, 110 },
			nil,
		},
		"check_interval at its bounds": {
			func(c *Config) { c.CheckInterval, c.StaleAfter = 10*time.Second, 20*time.Second },
			nil,
		},
		"stale_after under two checks": {
			func(c *Config) { c.CheckInterval, c.StaleAfter = 10*time.Second, 15*time.Second },
			[]fieldError{{nil, "got 15s at a check_interval of 10s"}},
		},
		"stale_after 0 at any interval": {
			func(c *Config) { c.CheckInterval, c.StaleAfter = 10*time.Millisecond, 0 },
			nil,
		},
		"retry_after.max at its bound": {
			func(c *Config) { c.RetryAfter.Max = time.Minute },
			nil,
		},
		"default rule order": {
			func(c *Config) {
				c.Rules[decision.RuleKeyDefault] = decision.RuleConfig{DropMin: ptrTo(0.6), DropMax: ptrTo(0.4)}
			},
			[]fieldError{{nil, "rules::default: drop_min must be <= drop_max, got 0.6 and 0.4"}},
		},
		"inherited drop_min": {
			func(c *Config) {
				c.Rules[decision.RuleKeyDefault] = decision.RuleConfig{DropMin: ptrTo(0.5)}
				c.Rules["logs"] = decision.RuleConfig{DropMax: ptrTo(0.3)}
			},
			[]fieldError{{nil, "rules: logs: drop_min must be <= drop_max, got 0.5 and 0.3 (drop_min inherited from default)"}},
		},
		"disabled slot is not checked": {
			func(c *Config) { c.Memory.Lines = decision.Lines{Hard: 5} },
			nil,
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := confmap.Validate(defaultConfigWith(tc.edit))
			if len(tc.want) == 0 {
				require.NoError(t, err)
				return
			}
			requireInvalid(t, tc.want, err)
		})
	}
}

// TestConfigUnknownKeys checks confmap's own rejection of a key the
// Config does not have, nested or not.
func TestConfigUnknownKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   map[string]any
		want string
	}{
		{map[string]any{"enable": true}, "'throttleextension.Config' has invalid keys: enable"},
		{map[string]any{"cpu": map[string]any{"entry": 0.8}}, "'cpu' has invalid keys: entry"},
		{map[string]any{"memory": map[string]any{"soft_limit": map[string]any{"shares": 0.8}}}, "'memory.soft_limit' has invalid keys: shares"},
		{map[string]any{"rules": map[string]any{"traces": map[string]any{"drop": 0.8}}}, "'rules[traces]' has invalid keys: drop"},
	} {
		err := confmap.NewFromStringMap(tc.in).Unmarshal(createDefaultConfig())
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestSizeFromScalarTypes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in        any
		want      admission.ByteSize
		wantError string
	}{
		{int(1048576), admission.MiB, ""},
		{int64(2048), 2 * admission.KiB, ""},
		{uint64(1 << 40), admission.TiB, ""},
		{float64(4096), 4 * admission.KiB, ""}, // YAML 4096.0 or 4e3-style numbers
		{"1MiB", admission.MiB, ""},
		{"0", 0, ""},
		{int(-1), 0, "invalid size -1: must be >= 0"},
		{float64(-1), 0, "invalid size -1: want a whole number of bytes >= 0"},
		{float64(0.5), 0, "invalid size 0.5: want a whole number of bytes >= 0"},
		{math.NaN(), 0, "invalid size NaN: want a whole number of bytes >= 0"},
		{true, 0, "invalid size true (bool): want a number of bytes or a size like 24MiB"},
	} {
		conf := confmap.NewFromStringMap(map[string]any{
			"admission": map[string]any{"unknown_size": tc.in, "max_inflight_bytes": tc.in},
		})
		cfg := createDefaultConfig().(*Config)
		err := conf.Unmarshal(cfg)
		if tc.wantError != "" {
			require.ErrorContains(t, err, tc.wantError, "%#v", tc.in)
			continue
		}
		require.NoError(t, err, "%#v", tc.in)
		assert.Equal(t, tc.want, cfg.Admission.UnknownSize, "%#v", tc.in)
		assert.Equal(t, admission.FixedInflightBudget(tc.want), cfg.Admission.MaxInflightBytes, "%#v", tc.in)
	}
}

// TestConfigRoundTrip marshals a configuration through confmap (as
// "otelcol print-config" does) and reads it back.
func TestConfigRoundTrip(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "full", "benchmark", "sizes_units", "budget_off", "admission_limits_off"} {
		id := component.NewIDWithName(metadata.Type, name)
		if name == "" {
			id = component.NewID(metadata.Type)
		}
		t.Run(id.String(), func(t *testing.T) {
			cfg, err := loadConfig(t, id)
			require.NoError(t, err)
			conf := confmap.New()
			require.NoError(t, conf.Marshal(cfg))
			back := createDefaultConfig().(*Config)
			require.NoError(t, conf.Unmarshal(back))
			if !cfg.Status.HasValue() {
				// configoptional marshals an absent (Default) section as
				// "status: null", and reads "status: null" back as present
				// with the defaults (as for otlpreceiver's protocols). Not
				// ours to change; the rest must survive the trip.
				back.Status = cfg.Status
			}
			assert.Equal(t, cfg, back)
		})
	}
}

func TestConfigStaleAfter(t *testing.T) {
	t.Parallel()
	cfg := defaultConfigWith(func(c *Config) {
		c.CheckInterval = 100 * time.Millisecond
		c.StaleAfter = 2 * time.Second
	})
	assert.Equal(t, 2*time.Second, cfg.runnerConfig().StaleAfter)
	cfg.StaleAfter = 0
	require.NoError(t, confmap.Validate(cfg))
	assert.Equal(t, time.Duration(0), cfg.runnerConfig().StaleAfter, "0 = never")
	cfg.StaleAfter = -3 * time.Second
	requireInvalid(t, []fieldError{{nil, "stale_after must be 0 (never), or at least 1s and at least 2 × check_interval, got -3s"}}, confmap.Validate(cfg))
}

// TestConfigRunner: the runner gets the sections as loaded, and the request
// path's sections resolved.
func TestConfigRunner(t *testing.T) {
	t.Parallel()
	full, err := loadConfig(t, component.NewIDWithName(metadata.Type, "full"))
	require.NoError(t, err)
	rc := full.runnerConfig()
	assert.Equal(t, full.Settings, rc.Settings)
	assert.Equal(t, full.CPU, rc.CPU)
	assert.Equal(t, full.Memory, rc.Memory)
	assert.Equal(t, full.Rules, rc.Rules)
	require.NotNil(t, rc.Status)
	assert.Equal(t, "127.0.0.1:55681", rc.Status.NetAddr.Endpoint)
	assert.Same(t, full, rc.Effective)

	def := createDefaultConfig().(*Config)
	assert.Nil(t, def.runnerConfig().Status, "the status page is off by default")
}

// TestConfigErrorAsCollectorPrints shows the message a user gets: the
// collector validates its whole configuration with confmap.Validate, which
// calls every section's Validate and prefixes each error with its path,
// from the component down to the section.
func TestConfigErrorAsCollectorPrints(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"cpu_exit_ge_enter":      "extensions::throttle::cpu: exit must be < enter, got 0.7 and 0.7",
		"memory_hard_over_one":   "extensions::throttle::memory: hard must be <= 1, got 1.05",
		"drop_min_gt_max":        "extensions::throttle::rules::logs: drop_min must be <= drop_max, got 0.6 and 0.4",
		"unknown_size_zero":      "extensions::throttle::admission: unknown_size must be > 0 when max_inflight_bytes is not 0",
		"check_interval_short":   "extensions::throttle: check_interval must be between 10ms and 10s, got 5ms",
		"heap_target_over_share": "extensions::throttle::memory::soft_limit: heap_target must be below share (or 0), got 0.6 and share 0.5",
	} {
		cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, name))
		require.NoError(t, err)
		collectorLike := struct {
			Extensions map[component.ID]component.Config `mapstructure:"extensions"`
		}{Extensions: map[component.ID]component.Config{component.NewID(metadata.Type): cfg}}
		assert.EqualError(t, confmap.Validate(collectorLike), want, name)
	}
}
