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
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// defaultConfigWith returns the default configuration changed by edit.
func defaultConfigWith(edit func(*Config)) *Config {
	cfg := createDefaultConfig().(*Config)
	edit(cfg)
	return cfg
}

func statusAt(endpoint string) configoptional.Optional[confighttp.ServerConfig] {
	s := defaultStatusServerConfig()
	s.NetAddr.Endpoint = endpoint
	return configoptional.Some(s)
}

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
				Enabled:        true,
				ObserveOnly:    true,
				SampleInterval: 100 * time.Millisecond,
				Signal: SignalConfig{
					CPUSlowBeta:    0.9,
					CPUFastBeta:    0.5,
					FallbackCores:  1.5,
					MemoryLimitMiB: 512,
				},
				Thresholds: ThresholdsConfig{
					CPU: SlotConfig{Enabled: true, Enter: 0.75, Exit: 0.65, Hard: 0.95, BreachN: 4, MaxShed: 0.5},
					Mem: SlotConfig{Enabled: false, Enter: 0.8, Exit: 0.7, Hard: 0.9, BreachN: 2, MaxShed: 0.9},
				},
				Rules: map[string]RuleConfig{
					"default":  {Enabled: ptrTo(true), DropMin: ptrTo(0.1), DropMax: ptrTo(0.9)},
					"traces":   {DropMax: ptrTo(0.5)},
					"metrics":  {Enabled: ptrTo(false)},
					"logs":     {DropMin: ptrTo(0.2)},
					"profiles": {Enabled: ptrTo(true), DropMin: ptrTo(0.0), DropMax: ptrTo(0.0)},
				},
				RetryAfter:   RetryAfterConfig{Min: time.Second, Max: 10 * time.Second},
				RecoveryRamp: 2 * time.Second,
				Admission: AdmissionConfig{
					MaxInflightBytes: FixedInflightBudget(24 * MiB),
					UnknownSize:      512 * KiB,
					IdleTimeout:      5 * time.Second,
					PeerShare:        0.25,
					WaitTimeout:      2 * time.Second,
				},
				Pacing:     PacingConfig{Delay: 250 * time.Millisecond, MaxHeld: 64},
				Queue:      QueueConfig{MaxWait: 2 * time.Second, MaxHeld: 32},
				GoMemLimit: GoMemLimitConfig{Enabled: false, Share: 0.7, HeapTarget: 0.4},
				Routes: RoutesConfig{
					HTTP: map[string]string{
						"/prometheus/write": "metrics",
						"/api/v2/spans":     "traces",
						"/loki/api/v1/push": "logs",
					},
					GRPC: map[string]string{"/my.pkg.Service/Push": "logs"},
				},
				Status:              statusAt("127.0.0.1:55681"),
				ReportStatus:        true,
				StaleAfterIntervals: 8,
			},
		},
		{
			id: component.NewIDWithName(metadata.Type, "benchmark"),
			expected: defaultConfigWith(func(c *Config) {
				c.Signal.FallbackCores = 1
				c.Thresholds.CPU = SlotConfig{Enabled: true, Enter: 0.85, Exit: 0.70, Hard: 1.20, BreachN: 3, MaxShed: decision.DefaultCPUMaxShed}
				c.Thresholds.Mem = SlotConfig{Enabled: true, Enter: 0.70, Exit: 0.60, Hard: 0.80, BreachN: 1, MaxShed: 1}
				c.Rules = map[string]RuleConfig{
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
				c.Status = configoptional.Some(defaultStatusServerConfig())
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "status_off"),
			expected: defaultConfigWith(func(c *Config) {
				c.Status = configoptional.None[confighttp.ServerConfig]()
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "sizes_int"),
			expected: defaultConfigWith(func(c *Config) {
				c.Admission.MaxInflightBytes = FixedInflightBudget(32 * MiB)
				c.Admission.UnknownSize = 64 * KiB
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "sizes_units"),
			expected: defaultConfigWith(func(c *Config) {
				c.Admission.MaxInflightBytes = FixedInflightBudget(64_000_000)
				c.Admission.UnknownSize = 1536
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "budget_off"),
			expected: defaultConfigWith(func(c *Config) {
				c.Admission.MaxInflightBytes = FixedInflightBudget(0)
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
				c.Admission.PeerShare = 1
				c.Admission.WaitTimeout = 0
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "cpu_off"),
			expected: defaultConfigWith(func(c *Config) {
				c.Thresholds.CPU = SlotConfig{MaxShed: decision.DefaultCPUMaxShed}
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
// collector's message that names its field.
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
		require.ErrorIs(t, err, w.err)
		assert.Contains(t, err.Error(), w.field)
	}
	assert.Len(t, strings.Split(err.Error(), "\n"), len(want), "one line per error: %v", err)
}

func TestLoadConfigInvalid(t *testing.T) {
	t.Parallel()
	tests := map[string][]fieldError{
		"disabled_invalid":         {{errExitNotBelowEnter, "thresholds::cpu: exit must be < enter, got 0.95 and 0.9"}},
		"pacing_delay_negative":    {{errPacingDelay, "pacing: delay"}},
		"pacing_delay_too_long":    {{errPacingDelay, "pacing: delay"}},
		"pacing_max_held_negative": {{errPacingMaxHeld, "pacing: max_held"}},
		"cpu_exit_ge_enter":        {{errExitNotBelowEnter, "thresholds::cpu: exit"}},
		"cpu_enter_ge_hard":        {{errEnterNotBelowHard, "thresholds::cpu: enter"}},
		"mem_exit_zero":            {{errExitNotAboveZero, "thresholds::mem: exit"}},
		"mem_hard_over_one":        {{errMemHardAboveOne, "thresholds: mem: hard"}},
		"breach_n_zero": {
			{errBreachN, "thresholds::cpu: breach_n"},
			{errBreachN, "thresholds::mem: breach_n"},
		},
		"max_shed_out_of_range": {
			{errMaxShed, "thresholds::cpu: max_shed must be in (0, 1], got 0"},
			{errMaxShed, "thresholds::mem: max_shed must be in (0, 1], got 1.5"},
		},
		"beta_out_of_range": {
			{errCPUSlowBeta, "signal: cpu_slow_beta"},
			{errCPUFastBeta, "\ncpu_fast_beta"},
		},
		"fallback_cores_negative": {{errFallbackCores, "signal: fallback_cores"}},
		"sample_interval_short":   {{errSampleInterval, "sample_interval"}},
		"drop_out_of_range": {
			{errDropRange, "rules::traces: drop_min"},
			{errDropRange, "\ndrop_max"},
		},
		"drop_min_gt_max":           {{errDropOrder, "rules::logs: drop_min"}},
		"drop_min_gt_inherited_max": {{errDropOrder, "rules: traces: drop_min must be <= drop_max, got 0.5 and 0.3 (drop_max inherited from default)"}},
		"unknown_rule":              {{errUnknownSignal, `rules: unknown signal "tracez", want one of default, traces, metrics, logs, profiles`}},
		"retry_after_inverted":      {{errRetryAfterOrder, "retry_after: min must be <= max"}},
		"retry_after_negative":      {{errRetryAfterMin, "retry_after: min"}},
		"recovery_ramp_negative":    {{errRecoveryRamp, "recovery_ramp"}},
		"unknown_size_zero":         {{errUnknownSizeZero, "admission: unknown_size"}},
		"unknown_size_over_budget":  {{errUnknownSizeOverBudget, "admission: unknown_size must be <= max_inflight_bytes, got 2MiB and 1MiB"}},
		"admission_limits_invalid": {
			{errIdleTimeout, "admission: idle_timeout"},
			{errPeerShare, "\npeer_share"},
			{errWaitTimeout, "\nwait_timeout"},
		},
		"admission_limits_negative": {
			{errIdleTimeout, "admission: idle_timeout"},
			{errPeerShare, "\npeer_share"},
			{errWaitTimeout, "\nwait_timeout"},
		},
		"route_unknown_signal": {
			{errUnknownSignal, `routes: http "/x": unknown signal "foo", want one of traces, metrics, logs, profiles`},
			{errUnknownSignal, "\n" + `grpc "/a.B/C": unknown signal "default"`},
		},
		"route_bad_paths": {
			{middleware.ErrRouteUnclean, `routes: http "/a//b": path must be clean, want "/a/b"`},
			{middleware.ErrRouteQuery, "\n" + `http "/q?x=1"`},
			{middleware.ErrRouteNotRooted, "\n" + `http "x/y"`},
			{middleware.ErrRouteMethod, "\n" + `grpc "/pkg.Service/"`},
			{middleware.ErrRouteMethod, "\n" + `grpc "/x"`},
			{middleware.ErrRouteMethod, "\n" + `grpc "pkg.Service/Method"`},
		},
		"status_empty_endpoint": {{errStatusEndpoint, "status: endpoint"}},
		"stale_after_one":       {{errStaleAfterIntervals, "stale_after_intervals"}},
		"many": {
			{errSampleInterval, "sample_interval"},
			{errExitNotBelowEnter, "thresholds::cpu: exit"},
			{errUnknownSignal, `rules: unknown signal "metricz"`},
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
			"sample_interval must be >= 10ms, got 0s",
			"thresholds::cpu: exit must be < enter, got 0.95 and 0.9",
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
			"admission: idle_timeout must be 0 (off) or >= 1s, got 500ms",
			"peer_share must be in (0, 1], got 0",
			"wait_timeout must be between 0s and 10s, got 11s",
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
		{"unknown_key", "'throttleextension.Config' has invalid keys: sample_intervall"},
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
	assert.Equal(t, 250*time.Millisecond, cfg.SampleInterval)
	// The values of design §8, whichever package owns them.
	assert.Equal(t, SignalConfig{CPUSlowBeta: 0.95, CPUFastBeta: 0.7}, cfg.Signal)
	assert.Equal(t, ThresholdsConfig{
		CPU: SlotConfig{Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachN: 3, MaxShed: 0.2},
		Mem: SlotConfig{Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachN: 1, MaxShed: 1},
	}, cfg.Thresholds)
	assert.Equal(t, RetryAfterConfig{Min: time.Second, Max: 5 * time.Second}, cfg.RetryAfter)
	assert.Equal(t, 5*time.Second, cfg.RecoveryRamp)
	assert.Equal(t, PacingConfig{MaxHeld: 512}, cfg.Pacing)
	assert.Equal(t, QueueConfig{MaxWait: 5 * time.Second, MaxHeld: 256}, cfg.Queue)
	assert.Equal(t, GoMemLimitConfig{Enabled: true, Share: 0.80, HeapTarget: 0.50}, cfg.GoMemLimit)
	assert.Equal(t, 20, cfg.StaleAfterIntervals)
	assert.True(t, cfg.Admission.MaxInflightBytes.Auto())
	assert.Equal(t, MiB, cfg.Admission.UnknownSize)
	assert.Equal(t, 10*time.Second, cfg.Admission.IdleTimeout)
	assert.Equal(t, 0.5, cfg.Admission.PeerShare)
	assert.Equal(t, time.Second, cfg.Admission.WaitTimeout)
	assert.False(t, cfg.Status.HasValue(), "the status page is off by default")
	assert.False(t, cfg.ReportStatus)
	assert.Equal(t, 5*time.Second, cfg.StaleAfter())
	for s := range decision.NumSignals {
		assert.Equal(t, Rule{Enabled: true, DropMin: 0, DropMax: 1}, cfg.RuleFor(s), s.String())
	}
	// Two calls do not share state (maps, pointers).
	other := createDefaultConfig().(*Config)
	*other.Rules[ruleKeyDefault].DropMax = 0.5
	assert.Equal(t, 1.0, cfg.RuleFor(decision.Traces).DropMax)
}

func TestConfigRuleFor(t *testing.T) {
	t.Parallel()
	full, err := loadConfig(t, component.NewIDWithName(metadata.Type, "full"))
	require.NoError(t, err)
	assert.Equal(t, Rule{Enabled: true, DropMin: 0.1, DropMax: 0.5}, full.RuleFor(decision.Traces))
	assert.Equal(t, Rule{Enabled: false, DropMin: 0.1, DropMax: 0.9}, full.RuleFor(decision.Metrics))
	assert.Equal(t, Rule{Enabled: true, DropMin: 0.2, DropMax: 0.9}, full.RuleFor(decision.Logs))
	assert.Equal(t, Rule{Enabled: true, DropMin: 0, DropMax: 0}, full.RuleFor(decision.Profiles))

	bench, err := loadConfig(t, component.NewIDWithName(metadata.Type, "benchmark"))
	require.NoError(t, err)
	for s := range decision.NumSignals {
		want := Rule{Enabled: s != decision.Metrics, DropMin: 0, DropMax: 0.2}
		assert.Equal(t, want, bench.RuleFor(s), s.String())
	}
}

func TestConfigValidateNonFinite(t *testing.T) {
	t.Parallel()
	nan, inf := math.NaN(), math.Inf(1)
	cfg := defaultConfigWith(func(c *Config) {
		c.Signal.CPUSlowBeta = nan
		c.Signal.FallbackCores = inf
		c.Thresholds.CPU.Hard = inf
		c.Thresholds.Mem.Enter = nan
		c.Rules["traces"] = RuleConfig{DropMax: ptrTo(nan)}
		c.Admission.PeerShare = nan
	})
	requireInvalid(t, []fieldError{
		{errCPUSlowBeta, "signal: cpu_slow_beta must be in (0, 1), got NaN"},
		{errFallbackCores, "\nfallback_cores must be a number >= 0, got +Inf"},
		{errNotFinite, "thresholds::cpu: hard must be a finite number, got +Inf"},
		{errNotFinite, "thresholds::mem: enter must be a finite number, got NaN"},
		{errDropRange, "rules::traces: drop_max must be in [0, 1], got NaN"},
		{errPeerShare, "admission: peer_share must be in (0, 1], got NaN"},
	}, confmap.Validate(cfg))
}

func TestConfigValidateMemoryLimitOverflow(t *testing.T) {
	t.Parallel()
	cfg := defaultConfigWith(func(c *Config) { c.Signal.MemoryLimitMiB = 1 << 44 })
	requireInvalid(t, []fieldError{{errMemoryLimitMiB, "signal: memory_limit_mib must be <= 17592186044415, got 17592186044416"}},
		confmap.Validate(cfg))
}

func TestConfigValidateSizeBounds(t *testing.T) {
	t.Parallel()
	cfg := defaultConfigWith(func(c *Config) {
		c.Admission.MaxInflightBytes = FixedInflightBudget(2 * TiB)
		c.Admission.UnknownSize = 2 * TiB
	})
	requireInvalid(t, []fieldError{
		{errSizeTooLarge, "admission: max_inflight_bytes must be at most 1TiB, got 2TiB"},
		{errSizeTooLarge, "\nunknown_size must be at most 1TiB, got 2TiB"},
	}, confmap.Validate(cfg))
}

func TestConfigValidateSections(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		edit func(*Config)
		want []fieldError
	}{
		"retry_after.max negative": {
			func(c *Config) { c.RetryAfter = RetryAfterConfig{Min: -time.Second, Max: -time.Second} },
			[]fieldError{
				{errRetryAfterMin, "retry_after: min"},
				{errRetryAfterMax, "\nmax must be >= 0, got -1s"},
			},
		},
		"queue": {
			func(c *Config) { c.Queue = QueueConfig{MaxWait: time.Minute, MaxHeld: -1} },
			[]fieldError{
				{errQueueMaxWait, "queue: max_wait must be between 0s and 30s, got 1m0s"},
				{errQueueMaxHeld, "\nmax_held must be >= 0, got -1"},
			},
		},
		"gomemlimit": {
			func(c *Config) { c.GoMemLimit.Share, c.GoMemLimit.HeapTarget = 1.5, 1 },
			[]fieldError{
				{errGoMemLimitShare, "gomemlimit: share must be in (0, 1], got 1.5"},
				{errHeapTarget, "\nheap_target must be in [0, 1), got 1"},
			},
		},
		"gomemlimit heap_target": {
			func(c *Config) { c.GoMemLimit.HeapTarget = -0.1 },
			[]fieldError{{errHeapTarget, "gomemlimit: heap_target must be in [0, 1), got -0.1"}},
		},
		"stale_after_intervals overflow": {
			func(c *Config) { c.SampleInterval, c.StaleAfterIntervals = 100*time.Millisecond, math.MaxInt64/1000 },
			[]fieldError{{errStaleAfterOverflow, "stale_after_intervals is too large: 9223372036854775 intervals of 100ms overflow a duration"}},
		},
		"default rule order": {
			func(c *Config) { c.Rules[ruleKeyDefault] = RuleConfig{DropMin: ptrTo(0.6), DropMax: ptrTo(0.4)} },
			[]fieldError{{errDropOrder, "rules::default: drop_min must be <= drop_max, got 0.6 and 0.4"}},
		},
		"inherited drop_min": {
			func(c *Config) {
				c.Rules[ruleKeyDefault] = RuleConfig{DropMin: ptrTo(0.5)}
				c.Rules["logs"] = RuleConfig{DropMax: ptrTo(0.3)}
			},
			[]fieldError{{errDropOrder, "rules: logs: drop_min must be <= drop_max, got 0.5 and 0.3 (drop_min inherited from default)"}},
		},
		"disabled slot is not checked": {
			func(c *Config) { c.Thresholds.Mem = SlotConfig{Hard: 5} },
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
		{map[string]any{"thresholds": map[string]any{"cpu": map[string]any{"entry": 0.8}}}, "'thresholds.cpu' has invalid keys: entry"},
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
		want      ByteSize
		wantError string
	}{
		{int(1048576), MiB, ""},
		{int64(2048), 2 * KiB, ""},
		{uint64(1 << 40), TiB, ""},
		{float64(4096), 4 * KiB, ""}, // YAML 4096.0 or 4e3-style numbers
		{"1MiB", MiB, ""},
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
		assert.Equal(t, FixedInflightBudget(tc.want), cfg.Admission.MaxInflightBytes, "%#v", tc.in)
	}
}

func TestParseByteSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in        string
		want      ByteSize
		wantError string
	}{
		{"0", 0, ""},
		{"1048576", MiB, ""},
		{"1B", 1, ""},
		{"24MiB", 24 * MiB, ""},
		{"24 MiB", 24 * MiB, ""},
		{" 24mib ", 24 * MiB, ""},
		{"256Mi", 256 * MiB, ""},
		{"64MB", 64_000_000, ""},
		{"64M", 64_000_000, ""},
		{"1kB", 1000, ""},
		{"1KiB", KiB, ""},
		{"1GiB", GiB, ""},
		{"1.5GiB", GiB + GiB/2, ""},
		{"2TiB", 2 * TiB, ""},
		{"1TB", 1_000_000_000_000, ""},
		{"18446744073709551615", math.MaxUint64, ""},
		{"", 0, `invalid size "": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"MiB", 0, `invalid size "MiB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"-1MiB", 0, `invalid size "-1MiB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"1XB", 0, `invalid size "1XB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"1.2.3MiB", 0, `invalid size "1.2.3MiB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"0.3KiB", 0, `invalid size "0.3KiB": not a whole number of bytes`},
		{"18446744073709551616", 0, `invalid size "18446744073709551616": too large`},
		{"16777216TiB", 0, `invalid size "16777216TiB": too large`},
		{"16777216.0TiB", 0, `invalid size "16777216.0TiB": too large`},
	} {
		got, err := ParseByteSize(tc.in)
		if tc.wantError != "" {
			require.EqualError(t, err, tc.wantError, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
}

func TestByteSizeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, n := range []ByteSize{0, 1, 1000, 1023, KiB, 1536, MiB, 24 * MiB, 64_000_000, GiB, 3 * TiB, math.MaxUint64} {
		text, err := n.MarshalText()
		require.NoError(t, err)
		var back ByteSize
		require.NoError(t, back.UnmarshalText(text), string(text))
		assert.Equal(t, n, back, string(text))
	}
	assert.Equal(t, "24MiB", (24 * MiB).String())
	assert.Equal(t, "1536KiB", ByteSize(1536*1024).String())
	assert.Equal(t, "1000B", ByteSize(1000).String())

	for _, b := range []InflightBudget{AutoInflightBudget(), FixedInflightBudget(0), FixedInflightBudget(24 * MiB), FixedInflightBudget(12345)} {
		text, err := b.MarshalText()
		require.NoError(t, err)
		var back InflightBudget
		require.NoError(t, back.UnmarshalText(text), string(text))
		assert.Equal(t, b, back, string(text))
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

func TestConfigResolveBudget(t *testing.T) {
	t.Parallel()
	auto := AutoInflightBudget()
	for _, tc := range []struct {
		name     string
		budget   InflightBudget
		memLimit uint64
		cores    float64
		want     uint64
	}{
		{"auto, 1 core, 300MiB: by CPU", auto, 300 << 20, 1, 10 << 20},
		{"auto, 0.3 core, 150MiB: by CPU", auto, 150 << 20, 0.3, 3145728},
		{"auto, 4 cores, 300MiB: by memory", auto, 300 << 20, 4, 25 << 20},
		{"auto, 16 cores, 1GiB: by memory", auto, 1 << 30, 16, (1 << 30) / 12},
		{"auto clamps low", auto, 6 << 20, 2, 1 << 20},
		{"auto clamps low by CPU", auto, 1 << 30, 0.05, 1 << 20},
		{"auto clamps high", auto, 64 << 30, 64, 256 << 20},
		{"auto, cores unknown: by memory", auto, 300 << 20, 0, 25 << 20},
		{"auto without a limit: 32MiB at most", auto, 0, 16, 32 << 20},
		{"auto without a limit, 1 core", auto, 0, 1, 10 << 20},
		{"off", FixedInflightBudget(0), 300 << 20, 1, 0},
		{"off without a limit", FixedInflightBudget(0), 0, 1, 0},
		{"fixed ignores the limit", FixedInflightBudget(24 * MiB), 1 << 30, 1, 24 << 20},
		{"fixed without a limit", FixedInflightBudget(24 * MiB), 0, 0, 24 << 20},
	} {
		assert.Equal(t, tc.want, tc.budget.ResolveBudget(tc.memLimit, tc.cores), tc.name)
	}
	assert.True(t, FixedInflightBudget(0).Off())
	assert.True(t, InflightBudget{}.Off(), "the zero value is off")
	assert.False(t, auto.Off())
	assert.Equal(t, ByteSize(0), auto.Size())
}

func TestConfigStaleAfter(t *testing.T) {
	t.Parallel()
	cfg := defaultConfigWith(func(c *Config) {
		c.SampleInterval = 100 * time.Millisecond
		c.StaleAfterIntervals = 8
	})
	assert.Equal(t, 800*time.Millisecond, cfg.StaleAfter())
	cfg.StaleAfterIntervals = 0
	assert.Equal(t, time.Duration(0), cfg.StaleAfter(), "0 = never")
	cfg.StaleAfterIntervals = -3
	requireInvalid(t, []fieldError{{errStaleAfterIntervals, "stale_after_intervals must be 0 (never) or >= 2, got -3"}}, confmap.Validate(cfg))
	cfg.StaleAfterIntervals = math.MaxInt64 / 1000
	requireInvalid(t, []fieldError{{errStaleAfterOverflow, "stale_after_intervals is too large"}}, confmap.Validate(cfg))
}

func TestConfigEngine(t *testing.T) {
	t.Parallel()
	// The defaults agree with the engine's own.
	def := createDefaultConfig().(*Config)
	assert.Equal(t, decision.DefaultConfig(), def.decisionConfig())
	assert.Equal(t, sampler.Config{
		Interval:    sampler.DefaultInterval,
		CPUFastBeta: sampler.DefaultCPUFastBeta,
		CPUSlowBeta: sampler.DefaultCPUSlowBeta,
	}, def.samplerConfig())

	full, err := loadConfig(t, component.NewIDWithName(metadata.Type, "full"))
	require.NoError(t, err)
	assert.Equal(t, sampler.Config{
		Interval:      100 * time.Millisecond,
		CPUFastBeta:   0.5,
		CPUSlowBeta:   0.9,
		FallbackCores: 1.5,
		MemoryLimit:   512 << 20,
	}, full.samplerConfig())
	assert.Equal(t, decision.Config{
		CPU: decision.Slot{Enabled: true, Enter: 0.75, Exit: 0.65, Hard: 0.95, BreachN: 4, MaxShed: 0.5},
		Mem: decision.Slot{Enabled: false, Enter: 0.8, Exit: 0.7, Hard: 0.9, BreachN: 2, MaxShed: 0.9},
		Rules: [decision.NumSignals]decision.Rule{
			decision.Traces:   {Enabled: true, DropMin: 0.1, DropMax: 0.5},
			decision.Metrics:  {Enabled: false, DropMin: 0.1, DropMax: 0.9},
			decision.Logs:     {Enabled: true, DropMin: 0.2, DropMax: 0.9},
			decision.Profiles: {Enabled: true, DropMin: 0, DropMax: 0},
		},
		RecoveryRamp: 2 * time.Second,
		Interval:     100 * time.Millisecond,
	}, full.decisionConfig())
}

// TestConfigErrorAsCollectorPrints shows the message a user gets: the
// collector validates its whole configuration with confmap.Validate, which
// calls every section's Validate and prefixes each error with its path,
// from the component down to the section.
func TestConfigErrorAsCollectorPrints(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"cpu_exit_ge_enter":     "extensions::throttle::thresholds::cpu: exit must be < enter, got 0.7 and 0.7",
		"mem_hard_over_one":     "extensions::throttle::thresholds: mem: hard must be <= 1, got 1.05",
		"drop_min_gt_max":       "extensions::throttle::rules::logs: drop_min must be <= drop_max, got 0.6 and 0.4",
		"unknown_size_zero":     "extensions::throttle::admission: unknown_size must be > 0 when max_inflight_bytes is not 0",
		"sample_interval_short": "extensions::throttle: sample_interval must be >= 10ms, got 5ms",
	} {
		cfg, err := loadConfig(t, component.NewIDWithName(metadata.Type, name))
		require.NoError(t, err)
		collectorLike := struct {
			Extensions map[component.ID]component.Config `mapstructure:"extensions"`
		}{Extensions: map[component.ID]component.Config{component.NewID(metadata.Type): cfg}}
		assert.EqualError(t, confmap.Validate(collectorLike), want, name)
	}
}
