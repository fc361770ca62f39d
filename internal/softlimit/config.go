// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package softlimit // import "github.com/otelthrottle/throttle/internal/softlimit"

import (
	"errors"
	"fmt"
	"strconv"
)

const (
	// defaultShare is the soft limit's default share of the container's
	// memory limit: under the throttle's default memory enter line, so that
	// the collector collects harder before the throttle has to shed, and
	// leaving room for what the Go runtime does not count (the binary's
	// pages, cgo).
	defaultShare = 0.80
	// defaultHeapTarget is the default share of the container's memory
	// limit the working set may reach between two collections while what
	// is live is small: well under the soft limit and the memory lines, so
	// that the heap's growth between two checks stays inside the soft
	// limit.
	defaultHeapTarget = 0.50
)

// Config is the memory::soft_limit section: whether the throttle sets the
// Go runtime's soft memory limit (GOMEMLIMIT) from the memory limit, and to
// what share of it. The throttle never overrides a limit set by the
// GOMEMLIMIT environment variable or by anything else in the process, and
// gives the limit back at shutdown.
type Config struct {
	// Enabled lets the throttle set the limit when nobody else has.
	// Default true.
	Enabled bool `mapstructure:"enabled"`
	// Share of the memory limit the soft limit is set to, in (0, 1].
	// Default 0.80.
	Share float64 `mapstructure:"share"`
	// HeapTarget is the share of the memory limit the working set may
	// reach between two collections while what is live is small: the
	// throttle raises the GC percent (GOGC) to let the heap grow into it,
	// never below GOGC's default, only while a soft memory limit is in
	// force and GOGC is not set, and gives the default back at shutdown.
	// In [0, 1) and below share. Default 0.50; 0 leaves GOGC alone.
	HeapTarget float64 `mapstructure:"heap_target"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// DefaultConfig is the section's defaults.
func DefaultConfig() Config {
	return Config{Enabled: true, Share: defaultShare, HeapTarget: defaultHeapTarget}
}

// Errors of Validate; the collector puts the section's path before them.
var (
	errShare      = errors.New("share must be in (0, 1]")
	errHeapTarget = errors.New("heap_target must be in [0, 1)")
	// errHeapTargetOverShare: a heap let grow to or past the soft limit
	// keeps the GC collecting at the limit, the extra CPU the soft limit
	// is meant to spare until the memory lines are near.
	errHeapTargetOverShare = errors.New("heap_target must be below share (or 0)")
)

// Validate checks the section.
func (c Config) Validate() error {
	var errs []error
	shareOK := c.Share > 0 && c.Share <= 1 // also rejects NaN
	if !shareOK {
		errs = append(errs, fmt.Errorf("%w, got %s", errShare, formatFloat(c.Share)))
	}
	switch {
	case !(c.HeapTarget >= 0 && c.HeapTarget < 1): // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errHeapTarget, formatFloat(c.HeapTarget)))
	case shareOK && c.HeapTarget != 0 && c.HeapTarget >= c.Share:
		errs = append(errs, fmt.Errorf("%w, got %s and share %s", errHeapTargetOverShare, formatFloat(c.HeapTarget), formatFloat(c.Share)))
	}
	return errors.Join(errs...)
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
