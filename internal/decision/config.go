// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package decision // import "github.com/otelthrottle/throttle/internal/decision"

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultRecoveryRamp is recovery_ramp's default: after a collection
// memory drops in one check, and a burst let in during the next one could
// exceed the headroom, so leaving a memory Open lets load back in over a
// few seconds rather than at once.
const DefaultRecoveryRamp = 5 * time.Second

// Lines are one resource's lines and how the engine holds the resource to
// them: the part of its section (cpu, memory) the engine reads. The section
// checks them with Check against its resource's Bounds, and the resource's
// registration makes them a Slot.
type Lines struct {
	// Enabled includes the resource in the decision. A disabled resource
	// counts as safe: it never triggers and never blocks recovery; its
	// lines are not checked.
	Enabled bool `mapstructure:"enabled"`
	// Enter: Normal -> Shedding when the slow level is above it for
	// breach_duration.
	Enter float64 `mapstructure:"enter"`
	// Exit: Shedding -> Normal when every resource is below its exit for
	// breach_duration.
	Exit float64 `mapstructure:"exit"`
	// Hard: -> Open when the fast level is at or above it for
	// breach_duration.
	Hard float64 `mapstructure:"hard"`
	// BreachDuration is how long a condition must hold, rounded up to whole
	// checks (at least one).
	BreachDuration time.Duration `mapstructure:"breach_duration"`
	// MaxShed is the most this resource alone sheds before Open, a cap on
	// its share of the shedding severity, in (0, 1].
	MaxShed float64 `mapstructure:"max_shed"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// Bounds are what one resource's lines may be.
type Bounds struct {
	// MaxLine bounds each line; Why says in the error why (it follows the
	// bound: ": the lines are a share of ...").
	MaxLine float64
	Why     string
	// MaxBreach bounds breach_duration: longer leaves an overload
	// unanswered.
	MaxBreach time.Duration
}

// Errors of the checks; the collector puts the section's path before them.
var (
	errNotFinite         = errors.New("must be a finite number")
	errExitNotAboveZero  = errors.New("exit must be > 0")
	errExitNotBelowEnter = errors.New("exit must be < enter")
	errEnterNotBelowHard = errors.New("enter must be < hard")
	errLineAboveBound    = errors.New("must be <=")
	errBreachDuration    = errors.New("breach_duration must be between 0s and")
	errMaxShed           = errors.New("max_shed must be in (0, 1]")
	errRecoveryRamp      = errors.New("recovery_ramp must be >= 0")

	errUnknownSignal = errors.New("unknown signal")
	errDropRange     = errors.New("must be in [0, 1]")
	errDropOrder     = errors.New("drop_min must be <= drop_max")
)

// Check checks enabled lines against b: finite, 0 < exit < enter < hard, at
// most b.MaxLine, a breach_duration within b.MaxBreach and a max_shed in
// (0, 1]. Disabled lines are not checked. Comparisons are written so that
// NaN fails them.
func (l Lines) Check(b Bounds) error {
	if !l.Enabled {
		return nil
	}
	var errs []error
	lines := []struct {
		name string
		v    float64
	}{{"enter", l.Enter}, {"exit", l.Exit}, {"hard", l.Hard}}
	finite := true
	for _, f := range lines {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("%s %w, got %s", f.name, errNotFinite, formatFloat(f.v)))
			finite = false
		}
	}
	if finite {
		if l.Exit <= 0 {
			errs = append(errs, fmt.Errorf("%w, got %s", errExitNotAboveZero, formatFloat(l.Exit)))
		}
		if l.Exit >= l.Enter {
			errs = append(errs, fmt.Errorf("%w, got %s and %s", errExitNotBelowEnter, formatFloat(l.Exit), formatFloat(l.Enter)))
		}
		if l.Enter >= l.Hard {
			errs = append(errs, fmt.Errorf("%w, got %s and %s", errEnterNotBelowHard, formatFloat(l.Enter), formatFloat(l.Hard)))
		}
	}
	for _, f := range lines {
		if f.v > b.MaxLine && !math.IsInf(f.v, 1) {
			errs = append(errs, fmt.Errorf("%s %w %s%s, got %s", f.name, errLineAboveBound, formatFloat(b.MaxLine), b.Why, formatFloat(f.v)))
		}
	}
	if l.BreachDuration < 0 || l.BreachDuration > b.MaxBreach {
		errs = append(errs, fmt.Errorf("%w %v, got %v", errBreachDuration, b.MaxBreach, l.BreachDuration))
	}
	if !(l.MaxShed > 0 && l.MaxShed <= 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errMaxShed, formatFloat(l.MaxShed)))
	}
	return errors.Join(errs...)
}

// Slot is the engine's slot of the resource named name held to the lines
// at a check interval: the breach counted in checks, rounded up, at least
// one. How it sheds is the caller's to set.
func (l Lines) Slot(name string, interval time.Duration) Slot {
	n := 1
	if d := l.BreachDuration; d > 0 && interval > 0 {
		n = int(max(1, (d+interval-1)/interval))
	}
	return Slot{Name: name, Enabled: l.Enabled, Enter: l.Enter, Exit: l.Exit, Hard: l.Hard, BreachN: n, MaxShed: l.MaxShed}
}

// CheckRecoveryRamp checks recovery_ramp.
func CheckRecoveryRamp(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w, got %v", errRecoveryRamp, d)
	}
	return nil
}

// RuleKeyDefault is the key of the default rule under rules.
const RuleKeyDefault = "default"

// ruleKeys lists the keys accepted under rules, in the order they are
// reported: the default rule, then one per signal.
var ruleKeys = append([]string{RuleKeyDefault}, signalNames[:]...)

// RuleConfig is one entry of rules. A nil field is inherited: a signal's
// from the default rule, the default rule's from the built-in rule
// (enabled: true, drop_min: 0, drop_max: 1).
type RuleConfig struct {
	// Enabled: false exempts the signal from shedding and from Open, but
	// not from the memory backstop nor, at the receivers, the ramp after
	// it; the admission budget still bounds its bytes.
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
// rule or a signal. A signal's rule overrides the default rule field by
// field; the default rule overrides the built-in one field by field.
type RulesConfig map[string]RuleConfig

// DefaultRulesConfig is the rules section's default: the built-in rule,
// written out as the default rule.
func DefaultRulesConfig() RulesConfig {
	b := DefaultRule()
	return RulesConfig{RuleKeyDefault: {Enabled: &b.Enabled, DropMin: &b.DropMin, DropMax: &b.DropMax}}
}

// Rule is the effective rule of signal s: its entry over the default rule,
// field by field.
func (rs RulesConfig) Rule(s Signal) Rule {
	return rs[s.String()].over(rs.defaultRule())
}

// Rules are the effective rules of every signal, indexed by Signal.
func (rs RulesConfig) Rules() [NumSignals]Rule {
	var out [NumSignals]Rule
	for s := range NumSignals {
		out[s] = rs.Rule(s)
	}
	return out
}

func (rs RulesConfig) defaultRule() Rule { return rs[RuleKeyDefault].over(DefaultRule()) }

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
	for _, k := range signalNames {
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
				formatFloat(eff.DropMin), formatFloat(eff.DropMax), inherited, RuleKeyDefault))
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
		return fmt.Errorf("%w, got %s and %s", errDropOrder, formatFloat(*r.DropMin), formatFloat(*r.DropMax))
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
			errs = append(errs, fmt.Errorf("%s %w, got %s", f.name, errDropRange, formatFloat(*f.v)))
		}
	}
	return errors.Join(errs...)
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
