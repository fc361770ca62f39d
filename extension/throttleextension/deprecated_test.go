// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// loadDeprecatedConfig unmarshals the configuration named name in
// testdata/config_deprecated.yaml over the default one, as the collector
// does.
func loadDeprecatedConfig(t *testing.T, name string) (*Config, error) {
	t.Helper()
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config_deprecated.yaml"))
	require.NoError(t, err)
	sub, err := cm.Sub(component.NewIDWithName(metadata.Type, name).String())
	require.NoError(t, err)
	cfg := createDefaultConfig().(*Config)
	return cfg, sub.Unmarshal(cfg)
}

// withoutDeprecations is cfg without its deprecation messages, to compare
// with a configuration written in the new names.
func withoutDeprecations(cfg *Config) *Config {
	c := *cfg
	c.deprecations = nil
	return &c
}

// TestDeprecatedNamesLoadAsNew: a configuration in the previous release's
// names loads to the same Config as the one in this release's names, with
// one message per old key naming its replacement.
func TestDeprecatedNamesLoadAsNew(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"full", []string{
			"`sample_interval` is deprecated: use `check_interval`",
			"`stale_after_intervals` is deprecated: use `stale_after` (20 × check_interval 100ms = 2s)",
			"`signal::cpu_slow_beta` is deprecated: use `cpu::slow_window` (0.9 at check_interval 100ms = 949.1ms)",
			"`signal::cpu_fast_beta` is deprecated: use `cpu::fast_window` (0.5 at check_interval 100ms = 144.3ms)",
			"`signal::fallback_cores` is deprecated: use `cpu::fallback_cores`",
			"`signal::memory_limit_mib` is deprecated: use `memory::limit_mib`",
			"`thresholds::cpu::enabled` is deprecated: use `cpu::enabled`",
			"`thresholds::cpu::enter` is deprecated: use `cpu::enter`",
			"`thresholds::cpu::exit` is deprecated: use `cpu::exit`",
			"`thresholds::cpu::hard` is deprecated: use `cpu::hard`",
			"`thresholds::cpu::max_shed` is deprecated: use `cpu::max_shed`",
			"`thresholds::cpu::breach_n` is deprecated: use `cpu::breach_duration` (4 × check_interval 100ms = 400ms)",
			"`thresholds::mem::enabled` is deprecated: use `memory::enabled`",
			"`thresholds::mem::enter` is deprecated: use `memory::enter`",
			"`thresholds::mem::exit` is deprecated: use `memory::exit`",
			"`thresholds::mem::hard` is deprecated: use `memory::hard`",
			"`thresholds::mem::max_shed` is deprecated: use `memory::max_shed`",
			"`thresholds::mem::breach_n` is deprecated: use `memory::breach_duration` (2 × check_interval 100ms = 200ms)",
			"`gomemlimit::enabled` is deprecated: use `memory::soft_limit::enabled`",
			"`gomemlimit::share` is deprecated: use `memory::soft_limit::share`",
			"`gomemlimit::heap_target` is deprecated: use `memory::soft_limit::heap_target`",
			"`queue::max_wait` is deprecated: use `hold::max_wait`",
			"`queue::max_held` is deprecated: use `hold::max_requests`",
			"`pacing::delay` is deprecated: use `tarpit::delay`",
			"`pacing::max_held` is deprecated: use `tarpit::max_requests`",
		}},
		{"benchmark", []string{
			"`sample_interval` is deprecated: use `check_interval`",
			"`signal::cpu_slow_beta` is deprecated: use `cpu::slow_window` (0.95 at check_interval 250ms = 4.874s)",
			"`signal::cpu_fast_beta` is deprecated: use `cpu::fast_window` (0.7 at check_interval 250ms = 700.9ms)",
			"`signal::fallback_cores` is deprecated: use `cpu::fallback_cores`",
			"`thresholds::cpu::enabled` is deprecated: use `cpu::enabled`",
			"`thresholds::cpu::enter` is deprecated: use `cpu::enter`",
			"`thresholds::cpu::exit` is deprecated: use `cpu::exit`",
			"`thresholds::cpu::hard` is deprecated: use `cpu::hard`",
			"`thresholds::cpu::breach_n` is deprecated: use `cpu::breach_duration` (3 × check_interval 250ms = 750ms)",
			"`thresholds::mem::enabled` is deprecated: use `memory::enabled`",
			"`thresholds::mem::enter` is deprecated: use `memory::enter`",
			"`thresholds::mem::exit` is deprecated: use `memory::exit`",
			"`thresholds::mem::hard` is deprecated: use `memory::hard`",
			"`thresholds::mem::breach_n` is deprecated: use `memory::breach_duration` (1 × check_interval 250ms = 250ms)",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, err := loadDeprecatedConfig(t, tc.name)
			require.NoError(t, err)
			require.NoError(t, confmap.Validate(old))
			cur, err := loadConfig(t, component.NewIDWithName(metadata.Type, tc.name))
			require.NoError(t, err)
			assert.Empty(t, cur.deprecations, "the new names are not deprecated")
			assert.Equal(t, cur, withoutDeprecations(old))
			assert.Equal(t, tc.want, old.deprecations)
			// What the engine and the sampler get is the same too.
			assert.Equal(t, cur.decisionConfig(), old.decisionConfig())
			assert.Equal(t, cur.samplerConfig(), old.samplerConfig())
		})
	}
}

// TestDeprecatedWeightsKeepTheirMeaning: an EWMA weight of the previous
// release becomes the time constant that gives the same weight at the
// check interval in force, to the millisecond.
func TestDeprecatedWeightsKeepTheirMeaning(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		interval string
		beta     float64
	}{{"250ms", 0.95}, {"250ms", 0.7}, {"100ms", 0.9}, {"10ms", 0.5}, {"1s", 0.95}} {
		cfg := createDefaultConfig().(*Config)
		require.NoError(t, confmap.NewFromStringMap(map[string]any{
			"sample_interval": tc.interval,
			"signal":          map[string]any{"cpu_slow_beta": tc.beta},
		}).Unmarshal(cfg))
		require.NoError(t, confmap.Validate(cfg))
		got := sampler.EWMABeta(cfg.CheckInterval, cfg.CPU.SlowWindow)
		assert.InDelta(t, tc.beta, got, 1e-4, "%v at %s: window %v", tc.beta, tc.interval, cfg.CPU.SlowWindow)
	}
}

// TestDeprecatedMixedWithNew: old and new names in one configuration, each
// setting once: the old ones join the new sections, and counts of checks
// turn into durations at the check_interval the configuration sets.
func TestDeprecatedMixedWithNew(t *testing.T) {
	t.Parallel()
	cfg, err := loadDeprecatedConfig(t, "mixed")
	require.NoError(t, err)
	require.NoError(t, confmap.Validate(cfg))
	want := defaultConfigWith(func(c *Config) {
		c.CheckInterval = 100 * time.Millisecond
		c.StaleAfter = 2 * time.Second
		c.CPU.Enter, c.CPU.Exit, c.CPU.Hard = 0.75, 0.65, 0.95
		c.CPU.BreachDuration, c.CPU.MaxShed = 400*time.Millisecond, 0.5
		c.Memory.LimitMiB = 512
		c.Memory.SoftLimit.Share = 0.7
	})
	assert.Equal(t, want, withoutDeprecations(cfg))
	assert.Equal(t, []string{
		"`stale_after_intervals` is deprecated: use `stale_after` (20 × check_interval 100ms = 2s)",
		"`thresholds::cpu::max_shed` is deprecated: use `cpu::max_shed`",
		"`thresholds::cpu::breach_n` is deprecated: use `cpu::breach_duration` (4 × check_interval 100ms = 400ms)",
		"`gomemlimit::share` is deprecated: use `memory::soft_limit::share`",
	}, cfg.deprecations)
}

func TestDeprecatedInvalid(t *testing.T) {
	t.Parallel()
	for name, want := range map[string][]fieldError{
		"both": {
			{errRenamedBoth, "`sample_interval` is deprecated and its replacement is set too (`check_interval`): remove `sample_interval`"},
			{errRenamedBoth, "`thresholds::mem::enter` is deprecated and its replacement is set too (`memory::enter`): remove `thresholds::mem::enter`"},
		},
		"bad_values": {
			{errRenamedValue, "`stale_after_intervals`: invalid value of a deprecated key: must be >= 0, got -1"},
			{errRenamedValue, "`signal::cpu_slow_beta`: invalid value of a deprecated key: must be in (0, 1), got 1"},
			{errRenamedValue, "`thresholds::cpu::breach_n`: invalid value of a deprecated key: must be >= 1, got 0"},
			{errRenamedNotNumber, "`thresholds::mem::breach_n`: invalid value of a deprecated key: \"many\": not a number"},
		},
		"unknown_in_old_section": {
			{errDeprecatedLeft, "`thresholds::cpu::entry`: unknown key in a deprecated section"},
			{errDeprecatedLeft, "`pacing::max_hold`: unknown key in a deprecated section"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := loadDeprecatedConfig(t, name)
			require.Error(t, err)
			for _, w := range want {
				require.ErrorIs(t, err, w.err)
				assert.Contains(t, err.Error(), w.field)
			}
		})
	}
}

// TestWarningsLoggedAtCreation: the extension logs each deprecation and
// each setting that turns a protection off as one Warn when it is created.
func TestWarningsLoggedAtCreation(t *testing.T) {
	warns := func(t *testing.T, cfg *Config) []string {
		t.Helper()
		require.NoError(t, confmap.Validate(cfg))
		core, logs := observer.New(zapcore.InfoLevel)
		set := nopSettings()
		set.Logger = zap.New(core)
		newTestExtension(t, newFakeSource(50), cfg, set)
		var msgs []string
		for _, e := range logs.FilterLevelExact(zapcore.WarnLevel).All() {
			msgs = append(msgs, e.Message)
		}
		return msgs
	}
	load := func(t *testing.T, m map[string]any) *Config {
		t.Helper()
		cfg := createDefaultConfig().(*Config)
		require.NoError(t, confmap.NewFromStringMap(m).Unmarshal(cfg))
		return cfg
	}

	t.Run("defaults: none", func(t *testing.T) {
		assert.Empty(t, warns(t, createDefaultConfig().(*Config)))
	})
	t.Run("deprecated names", func(t *testing.T) {
		old, err := loadDeprecatedConfig(t, "benchmark")
		require.NoError(t, err)
		got := warns(t, old)
		assert.Equal(t, append(append([]string(nil), old.deprecations...),
			"`rules::metrics::enabled` is false: metrics are exempt: admitted in every state short of the memory hard line, and may take the admission budget over by as much again",
		), got)
		assert.Contains(t, got, "`thresholds::mem::enter` is deprecated: use `memory::enter`")
	})
	t.Run("protections off", func(t *testing.T) {
		assert.Equal(t, []string{
			"`observe_only` is true: decisions are made and counted, but no request is refused",
			"`memory::enabled` is false: nothing is shed or refused for memory; only the OOM killer bounds it",
			"`rules::traces::enabled` is false: traces are exempt: admitted in every state short of the memory hard line, and may take the admission budget over by as much again",
			"`rules::logs::enabled` is false: logs are exempt: admitted in every state short of the memory hard line, and may take the admission budget over by as much again",
			"`admission::idle_timeout` is 0: a client that stops sending keeps its share of the admission budget for as long as its connection stays open",
			"`admission::peer_share` is 1: one client (remote IP) may hold the whole admission budget and refuse every other",
		}, warns(t, load(t, map[string]any{
			"observe_only": true,
			"memory":       map[string]any{"enabled": false},
			"rules": map[string]any{
				"traces": map[string]any{"enabled": false},
				"logs":   map[string]any{"enabled": false},
			},
			"admission": map[string]any{"idle_timeout": "0s", "fairness": map[string]any{"share": 1}},
		})))
	})
	t.Run("every signal exempt by the default rule", func(t *testing.T) {
		got := warns(t, load(t, map[string]any{
			"rules": map[string]any{"default": map[string]any{"enabled": false}, "logs": map[string]any{"enabled": true}},
		}))
		assert.Equal(t, []string{
			"`rules::default::enabled` is false: traces are exempt: admitted in every state short of the memory hard line, and may take the admission budget over by as much again",
			"`rules::default::enabled` is false: metrics are exempt: admitted in every state short of the memory hard line, and may take the admission budget over by as much again",
			"`rules::default::enabled` is false: profiles are exempt: admitted in every state short of the memory hard line, and may take the admission budget over by as much again",
		}, got)
	})
	t.Run("budget off", func(t *testing.T) {
		assert.Equal(t, []string{
			"`admission::max_inflight_bytes` is 0: the admission budget is off, nothing bounds the bytes admitted between two checks",
		}, warns(t, load(t, map[string]any{"admission": map[string]any{"max_inflight_bytes": 0, "idle_timeout": "0s"}})))
	})
	t.Run("throttle off", func(t *testing.T) {
		assert.Equal(t, []string{
			"`enabled` is false: the throttle is off, no check runs and every request is admitted",
		}, warns(t, load(t, map[string]any{"enabled": false, "observe_only": true})))
	})
}
