// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package decision

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

// Lines and bounds like the extension's CPU and memory.
var (
	cpu       = Lines{Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachDuration: 750 * time.Millisecond, MaxShed: 0.2}
	mem       = Lines{Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachDuration: 250 * time.Millisecond, MaxShed: 1}
	cpuBounds = Bounds{
		MaxLine: 2, Why: ": the CPU lines are a share of the effective cores (0.9 is 90%), not a percent",
		MaxBreach: 10 * time.Second,
	}
	memBounds = Bounds{MaxLine: 1, MaxBreach: 2 * time.Second}
)

func TestLinesCheck(t *testing.T) {
	require.NoError(t, cpu.Check(cpuBounds))
	require.NoError(t, mem.Check(memBounds))
	with := func(l Lines, edit func(*Lines)) Lines { edit(&l); return l }
	for name, tc := range map[string]struct {
		lines  Lines
		bounds Bounds
		want   []error
		text   string
	}{
		"exit >= enter":       {with(cpu, func(l *Lines) { l.Exit = l.Enter }), cpuBounds, []error{errExitNotBelowEnter}, "exit must be < enter, got 0.9 and 0.9"},
		"enter >= hard":       {with(cpu, func(l *Lines) { l.Enter = l.Hard }), cpuBounds, []error{errEnterNotBelowHard}, "enter must be < hard, got 1.1 and 1.1"},
		"exit 0":              {with(mem, func(l *Lines) { l.Exit = 0 }), memBounds, []error{errExitNotAboveZero}, "exit must be > 0, got 0"},
		"not finite":          {with(mem, func(l *Lines) { l.Enter = math.NaN() }), memBounds, []error{errNotFinite}, "enter must be a finite number, got NaN"},
		"a percent for CPU":   {with(cpu, func(l *Lines) { l.Enter, l.Exit, l.Hard = 90, 80, 110 }), cpuBounds, []error{errLineAboveBound}, "enter must be <= 2: the CPU lines are a share of the effective cores (0.9 is 90%), not a percent, got 90"},
		"memory over 1":       {with(mem, func(l *Lines) { l.Hard = 1.05 }), memBounds, []error{errLineAboveBound}, "hard must be <= 1, got 1.05"},
		"breach too long":     {with(cpu, func(l *Lines) { l.BreachDuration = 11 * time.Second }), cpuBounds, []error{errBreachDuration}, "breach_duration must be between 0s and 10s, got 11s"},
		"breach negative":     {with(mem, func(l *Lines) { l.BreachDuration = -time.Millisecond }), memBounds, []error{errBreachDuration}, "breach_duration must be between 0s and 2s, got -1ms"},
		"max_shed 0":          {with(cpu, func(l *Lines) { l.MaxShed = 0 }), cpuBounds, []error{errMaxShed}, "max_shed must be in (0, 1], got 0"},
		"disabled: unchecked": {Lines{Hard: 5}, memBounds, nil, ""},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.lines.Check(tc.bounds)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			for _, w := range tc.want {
				require.ErrorIs(t, err, w)
			}
			assert.Contains(t, err.Error(), tc.text)
		})
	}
}

func TestLinesSlot(t *testing.T) {
	const ci = 250 * time.Millisecond
	assert.Equal(t, Slot{Name: "cpu", Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachN: 3, MaxShed: 0.2}, cpu.Slot("cpu", ci))
	for d, want := range map[time.Duration]int{0: 1, -time.Second: 1, time.Millisecond: 1, ci: 1, ci + 1: 2, 400 * time.Millisecond: 2} {
		assert.Equal(t, want, Lines{BreachDuration: d}.Slot("x", ci).BreachN, "%v", d)
	}
}

func TestRulesConfig(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	off := false
	rs := RulesConfig{
		RuleKeyDefault: {DropMin: f(0.1), DropMax: f(0.9)},
		"traces":       {DropMax: f(0.5)},
		"metrics":      {Enabled: &off},
	}
	require.NoError(t, confmap.Validate(rs))
	assert.Equal(t, Rule{Enabled: true, DropMin: 0.1, DropMax: 0.5}, rs.Rule(SignalTraces))
	assert.Equal(t, Rule{Enabled: false, DropMin: 0.1, DropMax: 0.9}, rs.Rule(SignalMetrics))
	assert.Equal(t, [NumSignals]Rule{
		{Enabled: true, DropMin: 0.1, DropMax: 0.5},
		{Enabled: false, DropMin: 0.1, DropMax: 0.9},
		{Enabled: true, DropMin: 0.1, DropMax: 0.9},
		{Enabled: true, DropMin: 0.1, DropMax: 0.9},
	}, rs.Rules())
	for s := range NumSignals {
		assert.Equal(t, DefaultRule(), DefaultRulesConfig().Rule(s))
	}

	for name, tc := range map[string]struct {
		rs   RulesConfig
		want error
		text string
	}{
		"unknown key":        {RulesConfig{"tracez": {}}, errUnknownSignal, `unknown signal "tracez", want one of default, traces, metrics, logs, profiles`},
		"out of range":       {RulesConfig{"logs": {DropMin: f(-0.1)}}, errDropRange, "logs: drop_min must be in [0, 1], got -0.1"},
		"in the wrong order": {RulesConfig{"logs": {DropMin: f(0.6), DropMax: f(0.4)}}, errDropOrder, "logs: drop_min must be <= drop_max, got 0.6 and 0.4"},
		"order with an inherited bound": {
			RulesConfig{RuleKeyDefault: {DropMax: f(0.3)}, "logs": {DropMin: f(0.5)}},
			errDropOrder,
			"logs: drop_min must be <= drop_max, got 0.5 and 0.3 (drop_max inherited from default)",
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := confmap.Validate(tc.rs)
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.text)
		})
	}
}

func TestCheckRecoveryRamp(t *testing.T) {
	require.NoError(t, CheckRecoveryRamp(0))
	require.NoError(t, CheckRecoveryRamp(DefaultRecoveryRamp))
	require.ErrorIs(t, CheckRecoveryRamp(-time.Second), errRecoveryRamp)
}
