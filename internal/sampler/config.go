// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package sampler // import "github.com/otelthrottle/throttle/internal/sampler"

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// DefaultInterval is check_interval's default: four checks a second.
const DefaultInterval = 250 * time.Millisecond

const (
	// minInterval: below 10ms the sampler's own file reads become a
	// noticeable share of a core, and CPU windows get too short to measure
	// against CFS periods.
	minInterval = 10 * time.Millisecond
	// maxInterval: a burst fills memory faster than any check sees it (at
	// 200 MB/s memory climbs from enter to the limit in 250ms), so a longer
	// interval leaves the memory lines to the OOM killer.
	maxInterval = 10 * time.Second

	// defaultCPUSlowWindow is the time constant of the slow CPU average,
	// the one the enter and exit lines read: long enough to ride out a
	// burst of a second or two, short enough to follow a load that stays.
	defaultCPUSlowWindow = 5 * time.Second
	// defaultCPUFastWindow is the time constant of the fast CPU average,
	// the one the hard line reads: a few checks.
	defaultCPUFastWindow = 700 * time.Millisecond
	// maxCPUWindow bounds the CPU averages' time constants: a longer one
	// answers an overload minutes late.
	maxCPUWindow = time.Minute

	// minMemoryLimitMiB: a collector's own baseline (binary, runtime,
	// buffers) fills a smaller limit past the memory hard line, a permanent
	// Open.
	minMemoryLimitMiB = 32
	// maxMemoryLimitMiB keeps limit_mib << 20 within a uint64.
	maxMemoryLimitMiB = math.MaxUint64 >> 20
)

// Config is the sampler's configuration: check_interval and how the cpu
// and memory sections measure.
type Config struct {
	// Interval is the time between two ticks (check_interval);
	// DefaultInterval when 0.
	Interval time.Duration
	CPU      CPUConfig
	Memory   MemoryConfig
	// Readers read the levels of WaterLevel.Levels, in order; at most
	// MaxResources.
	Readers []Reader
	// LimitsEvery is the slow cadence at which limits and cores are
	// re-read; DefaultLimitsEvery when 0. Not a user setting.
	LimitsEvery time.Duration
}

// CPUConfig is how CPU is measured: the cpu section's part the sampler
// reads. The section validates it with Check.
type CPUConfig struct {
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

// MemoryConfig is the memory limit: the memory section's part the sampler
// reads. The section validates it with Check.
type MemoryConfig struct {
	// LimitMiB overrides the memory limit read from the cgroup when it is
	// lower: above the cgroup's limit the cgroup's is used (and a warning
	// logged), as it would keep the memory lines and the soft memory limit
	// above the OOM killer's. 0 = from the cgroup (no limit there: the
	// memory signal is off); else at least 32.
	LimitMiB uint64 `mapstructure:"limit_mib"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// DefaultCPUConfig is how CPU is measured by default.
func DefaultCPUConfig() CPUConfig {
	return CPUConfig{SlowWindow: defaultCPUSlowWindow, FastWindow: defaultCPUFastWindow}
}

// Errors of the checks; the collector puts the section's path before them.
var (
	errInterval      = fmt.Errorf("check_interval must be between %v and %v", minInterval, maxInterval)
	errCPUWindow     = fmt.Errorf("must be > 0 and <= %v", maxCPUWindow)
	errFallbackCores = errors.New("fallback_cores must be a number >= 0")
	errLimitTooSmall = fmt.Errorf("limit_mib must be 0 (the cgroup's limit) or >= %d: a collector's own baseline fills a smaller limit past the hard line, a permanent Open", minMemoryLimitMiB)
	errLimitTooLarge = fmt.Errorf("limit_mib must be <= %d", uint64(maxMemoryLimitMiB))
)

// CheckInterval checks check_interval.
func CheckInterval(d time.Duration) error {
	if d < minInterval || d > maxInterval {
		return fmt.Errorf("%w, got %v", errInterval, d)
	}
	return nil
}

// Check checks how CPU is measured, whether the CPU lines are enabled or
// not: the status page and the telemetry show it either way.
func (c CPUConfig) Check() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"slow_window", c.SlowWindow}, {"fast_window", c.FastWindow}} {
		if f.v <= 0 || f.v > maxCPUWindow {
			errs = append(errs, fmt.Errorf("%s %w, got %v", f.name, errCPUWindow, f.v))
		}
	}
	if !(c.FallbackCores >= 0) || math.IsInf(c.FallbackCores, 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errFallbackCores, formatFloat(c.FallbackCores)))
	}
	return errors.Join(errs...)
}

// Check checks the memory limit, whether the memory lines are enabled or
// not: the soft memory limit and the admission budget follow it.
func (c MemoryConfig) Check() error {
	switch {
	case c.LimitMiB != 0 && c.LimitMiB < minMemoryLimitMiB:
		return fmt.Errorf("%w, got %d", errLimitTooSmall, c.LimitMiB)
	case c.LimitMiB > maxMemoryLimitMiB:
		return fmt.Errorf("%w, got %d", errLimitTooLarge, c.LimitMiB)
	}
	return nil
}

// limit is limit_mib in bytes, 0 for none. Check bounds it so that the
// shift cannot overflow.
func (c MemoryConfig) limit() uint64 { return c.LimitMiB << 20 }

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
