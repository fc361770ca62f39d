// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// FuzzConfigUnmarshal feeds fuzzed values to the fields with the most
// parsing and validation logic, through confmap as the collector does, and
// checks that unmarshalling and validation never panic, and that whatever
// validates keeps the invariants the engine relies on. The count is a
// number of checks for stale_after and the weight an EWMA weight of
// history for cpu::slow_window, as sampler.EWMABeta turns one into the
// other. Seeds are in
// testdata/fuzz/FuzzConfigUnmarshal; run longer with
// go test -run '^$' -fuzz FuzzConfigUnmarshal -fuzztime 30s ./extension/throttleextension/
func FuzzConfigUnmarshal(f *testing.F) {
	f.Add(0.80, 0.70, 0.90, 3, 0.95, 0.0, 1.0, "250ms", "auto", "1MiB", "default", "/prometheus/write", "metrics")
	f.Add(0.85, 0.70, 1.20, 3, 0.7, 0.0, 0.2, "250ms", "24MiB", "65536", "traces", "/my.pkg.Service/Push", "logs")
	f.Fuzz(func(t *testing.T, enter, exit, hard float64, breachN int, beta, dropMin, dropMax float64,
		interval, budget, unknownSize, ruleKey, route, signal string,
	) {
		conf := confmap.NewFromStringMap(map[string]any{
			"check_interval": interval,
			"stale_after":    (time.Duration(breachN) * 250 * time.Millisecond).String(),
			"cpu": map[string]any{
				"enter": enter, "exit": exit, "hard": hard, "fallback_cores": dropMax,
				"breach_duration": (time.Duration(breachN) * time.Millisecond).String(),
				"slow_window":     windowOf(beta),
			},
			"memory": map[string]any{"enter": enter, "exit": exit, "hard": hard, "soft_limit": map[string]any{"heap_target": dropMin}},
			"rules": map[string]any{
				ruleKey: map[string]any{"drop_min": dropMin, "drop_max": dropMax},
			},
			"admission": map[string]any{"max_inflight_bytes": budget, "unknown_size": unknownSize},
			"routes": map[string]any{
				"http": map[string]any{route: signal},
				"grpc": map[string]any{route: signal},
			},
		})
		cfg := createDefaultConfig().(*Config)
		if err := conf.Unmarshal(cfg); err != nil {
			return
		}
		if err := confmap.Validate(cfg); err != nil {
			require.NotEmpty(t, err.Error())
			return
		}

		// What validated holds the invariants.
		for _, s := range []decision.Slot{cfg.CPU.Slot("cpu", cfg.CheckInterval), cfg.Memory.Slot("memory", cfg.CheckInterval)} {
			if s.Enabled {
				require.True(t, 0 < s.Exit && s.Exit < s.Enter && s.Enter < s.Hard, "%+v", s)
				require.False(t, math.IsInf(s.Hard, 0))
				require.GreaterOrEqual(t, s.BreachN, 1)
			}
		}
		if cfg.CPU.Enabled {
			require.LessOrEqual(t, cfg.CPU.Hard, 2.0)
		}
		if cfg.Memory.Enabled {
			require.LessOrEqual(t, cfg.Memory.Hard, 1.0)
		}
		for s := range decision.NumSignals {
			r := cfg.Rules.Rule(s)
			require.True(t, 0 <= r.DropMin && r.DropMin <= r.DropMax && r.DropMax <= 1, "%s: %+v", s, r)
		}
		require.GreaterOrEqual(t, cfg.CheckInterval, 10*time.Millisecond)
		require.LessOrEqual(t, cfg.CheckInterval, 10*time.Second)
		for _, w := range []time.Duration{cfg.CPU.SlowWindow, cfg.CPU.FastWindow} {
			beta := sampler.EWMABeta(cfg.CheckInterval, w)
			require.True(t, beta >= 0 && beta < 1, "β %v of %v at %v", beta, w, cfg.CheckInterval)
		}
		if cfg.StaleAfter != 0 {
			require.GreaterOrEqual(t, cfg.StaleAfter, max(time.Second, 2*cfg.CheckInterval))
		}
		if cfg.Memory.SoftLimit.HeapTarget != 0 {
			require.Less(t, cfg.Memory.SoftLimit.HeapTarget, cfg.Memory.SoftLimit.Share)
		}

		b := cfg.Admission.MaxInflightBytes
		for _, limit := range []uint64{0, 1, 300 << 20, math.MaxUint64} {
			got := b.Resolve(limit, 1)
			switch {
			case b.IsOff():
				require.Zero(t, got)
			case b.IsAuto() && limit > 0:
				require.True(t, got >= 1<<20 && got <= 256<<20, "%d", got)
			}
		}
		if !b.IsOff() {
			require.NotZero(t, cfg.Admission.UnknownSize)
		}

		// The mapping to the runner's configuration takes anything valid.
		require.Equal(t, cfg.Memory.LimitMiB, cfg.runnerConfig().Memory.LimitMiB)

		// The size text a budget prints reads back as the same budget.
		var back admission.InflightBudget
		require.NoError(t, back.UnmarshalText([]byte(b.String())))
		require.Equal(t, b, back)
	})
}

// windowOf is the time constant of an EWMA weight of history at the default
// check interval (sampler.EWMABeta inverted), or a weight that is no
// duration as it is, for the decoder to reject.
func windowOf(beta float64) any {
	w := float64(sampler.DefaultInterval) / -math.Log(beta)
	if !(w > 0 && w < math.MaxInt64) { // also NaN
		return beta
	}
	return time.Duration(w).String()
}
