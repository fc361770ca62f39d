// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/collector/confmap"
)

// The configuration names of the previous release keep working for one
// more: Unmarshal moves each to its new name before the configuration is
// decoded, turning counts of checks and EWMA weights into durations at the
// check interval in force, and the extension logs one warning per old name
// when it is created.

// renamedKey is a key of the previous release and the key that replaces it.
// convert turns the old value into the new one at the check interval ci,
// and says how in a few words; nil keeps the value as it is.
type renamedKey struct {
	old, new string
	convert  func(v any, ci time.Duration) (any, string, error)
}

// renamedKeys are the keys of the previous release, in the order of their
// messages. sample_interval comes first: the conversions use the check
// interval the configuration ends up with.
var renamedKeys = func() []renamedKey {
	keys := []renamedKey{
		{"sample_interval", "check_interval", nil},
		{"stale_after_intervals", "stale_after", checksToDuration(0)},
		{"signal::cpu_slow_beta", "cpu::slow_window", betaToWindow},
		{"signal::cpu_fast_beta", "cpu::fast_window", betaToWindow},
		{"signal::fallback_cores", "cpu::fallback_cores", nil},
		{"signal::memory_limit_mib", "memory::limit_mib", nil},
	}
	for _, slot := range [][2]string{{"cpu", "cpu"}, {"mem", "memory"}} {
		old, nu := "thresholds::"+slot[0]+"::", slot[1]+"::"
		for _, k := range []string{"enabled", "enter", "exit", "hard", "max_shed"} {
			keys = append(keys, renamedKey{old + k, nu + k, nil})
		}
		keys = append(keys, renamedKey{old + "breach_n", nu + "breach_duration", checksToDuration(1)})
	}
	for _, k := range []string{"enabled", "share", "heap_target"} {
		keys = append(keys, renamedKey{"gomemlimit::" + k, "memory::soft_limit::" + k, nil})
	}
	return append(keys,
		renamedKey{"queue::max_wait", "hold::max_wait", nil},
		renamedKey{"queue::max_held", "hold::max_requests", nil},
		renamedKey{"pacing::delay", "tarpit::delay", nil},
		renamedKey{"pacing::max_held", "tarpit::max_requests", nil},
	)
}()

// deprecatedSections are the top-level keys of the previous release; once
// their known keys have moved, anything left in them is unknown.
var deprecatedSections = []string{"sample_interval", "stale_after_intervals", "signal", "thresholds", "gomemlimit", "queue", "pacing"}

// Errors of the deprecated keys, decoding errors: confmap.Validate never
// sees them.
var (
	errRenamedBoth      = errors.New("is deprecated and its replacement is set too")
	errRenamedValue     = errors.New("invalid value of a deprecated key")
	errDeprecatedLeft   = errors.New("unknown key in a deprecated section")
	errRenamedNotNumber = errors.New("not a number")
)

// Unmarshal implements confmap.Unmarshaler: it moves the keys of the
// previous release to their new names (deprecated.go), records a message
// for each, and decodes the result as usual.
func (cfg *Config) Unmarshal(conf *confmap.Conf) error {
	cfg.deprecations = nil
	if err := cfg.moveRenamedKeys(conf); err != nil {
		return err
	}
	return conf.Unmarshal(cfg)
}

// moveRenamedKeys rewrites conf in place: a Conf made anew would not carry
// the mark that keeps confmap from calling Unmarshal again on it.
func (cfg *Config) moveRenamedKeys(conf *confmap.Conf) error {
	var errs []error
	for _, k := range renamedKeys {
		if !conf.IsSet(k.old) {
			continue
		}
		v := conf.Get(k.old)
		if conf.IsSet(k.new) {
			errs = append(errs, fmt.Errorf("%#q %w (%#q): remove %#q", k.old, errRenamedBoth, k.new, k.old))
			continue
		}
		note := ""
		if k.convert != nil && v != nil {
			var err error
			if v, note, err = k.convert(v, checkInterval(conf, cfg.CheckInterval)); err != nil {
				errs = append(errs, fmt.Errorf("%#q: %w: %w", k.old, errRenamedValue, err))
				continue
			}
			note = " (" + note + ")"
		}
		conf.Delete(k.old)
		if err := conf.Merge(confmap.NewFromStringMap(nested(k.new, v))); err != nil {
			return err
		}
		cfg.deprecations = append(cfg.deprecations, fmt.Sprintf("%#q is deprecated: use %#q%s", k.old, k.new, note))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, section := range deprecatedSections {
		if !conf.IsSet(section) {
			continue
		}
		left, err := conf.Sub(section)
		if err != nil {
			return err
		}
		keys := left.AllKeys()
		if len(keys) > 0 {
			slices.Sort(keys)
			for _, k := range keys {
				errs = append(errs, fmt.Errorf("`%s::%s`: %w", section, k, errDeprecatedLeft))
			}
			continue
		}
		conf.Delete(section)
	}
	return errors.Join(errs...)
}

// nested is the map that sets path ("a::b::c") to v.
func nested(path string, v any) map[string]any {
	parts := strings.Split(path, confmap.KeyDelimiter)
	m := map[string]any{parts[len(parts)-1]: v}
	for i := len(parts) - 2; i >= 0; i-- {
		m = map[string]any{parts[i]: m}
	}
	return m
}

// checkInterval is the check interval the configuration ends up with: the
// one conf sets, or def.
func checkInterval(conf *confmap.Conf, def time.Duration) time.Duration {
	switch v := conf.Get("check_interval").(type) {
	case string:
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
	case time.Duration:
		if v > 0 {
			return v
		}
	default:
		if n, err := integer(v); err == nil && n > 0 {
			return time.Duration(n)
		}
	}
	return def
}

// checksToDuration turns a count of checks, at least least, into that many
// check intervals.
func checksToDuration(least int64) func(v any, ci time.Duration) (any, string, error) {
	return func(v any, ci time.Duration) (any, string, error) {
		n, err := integer(v)
		switch {
		case err != nil:
			return nil, "", err
		case n < least:
			return nil, "", fmt.Errorf("must be >= %d, got %d", least, n)
		case n > int64(math.MaxInt64/ci):
			return nil, "", fmt.Errorf("%d checks of %v overflow a duration", n, ci)
		}
		d := time.Duration(n) * ci
		return d.String(), fmt.Sprintf("%d × check_interval %v = %v", n, ci, d), nil
	}
}

// betaToWindow turns an EWMA's weight of history into its time constant
// at the check interval, to four significant digits (sampler.EWMABeta
// inverted).
func betaToWindow(v any, ci time.Duration) (any, string, error) {
	b, err := number(v)
	if err != nil {
		return nil, "", err
	}
	if !(b > 0 && b < 1) { // also NaN
		return nil, "", fmt.Errorf("must be in (0, 1), got %s", formatConfigFloat(b))
	}
	w := float64(ci) / -math.Log(b)
	if w >= float64(100*maxCPUWindow) {
		return nil, "", fmt.Errorf("%s is too close to 1", formatConfigFloat(b))
	}
	unit := time.Duration(math.Pow(10, max(0, math.Floor(math.Log10(w))-3)))
	d := max(1, time.Duration(w).Round(unit))
	return d.String(), fmt.Sprintf("%s at check_interval %v = %v", formatConfigFloat(b), ci, d), nil
}

// integer reads a whole number from a decoded YAML scalar.
func integer(v any) (int64, error) {
	switch n := v.(type) {
	case int:
		return int64(n), nil
	case int64:
		return n, nil
	case int32:
		return int64(n), nil
	case uint64:
		if n > math.MaxInt64 {
			return 0, fmt.Errorf("%d is too large", n)
		}
		return int64(n), nil
	case uint:
		return integer(uint64(n))
	case uint32:
		return int64(n), nil
	case float64:
		if n != math.Trunc(n) || math.Abs(n) >= math.MaxInt64 {
			return 0, fmt.Errorf("%s is not a whole number", formatConfigFloat(n))
		}
		return int64(n), nil
	case string:
		i, err := strconv.ParseInt(strings.TrimSpace(n), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", n, errRenamedNotNumber)
		}
		return i, nil
	}
	return 0, fmt.Errorf("%v (%T): %w", v, v, errRenamedNotNumber)
}

// number reads a number from a decoded YAML scalar.
func number(v any) (float64, error) {
	switch n := v.(type) {
	case float64:
		return n, nil
	case float32:
		return float64(n), nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
		if err != nil {
			return 0, fmt.Errorf("%q: %w", n, errRenamedNotNumber)
		}
		return f, nil
	}
	i, err := integer(v)
	return float64(i), err
}
