// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"

	"github.com/otelthrottle/throttle/internal/softlimit"
)

// SoftLimitConfig is the memory::soft_limit section: whether the throttle
// sets the Go runtime's soft memory limit (GOMEMLIMIT) from the memory
// limit, and to what share of it. The throttle never overrides a limit set
// by the GOMEMLIMIT environment variable or by anything else in the
// process, and gives the limit back at shutdown.
type SoftLimitConfig struct {
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

// Errors of the memory::soft_limit section; the collector prefixes the
// field path.
var (
	errSoftLimitShare = errors.New("share must be in (0, 1]")
	errHeapTarget     = errors.New("heap_target must be in [0, 1)")
	// errHeapTargetOverShare: a heap let grow to or past the soft limit
	// keeps the GC collecting at the limit, the extra CPU the soft limit
	// is meant to spare until the memory lines are near.
	errHeapTargetOverShare = errors.New("heap_target must be below share (or 0)")
)

// Validate checks the section; the collector prefixes the field path.
func (c SoftLimitConfig) Validate() error {
	var errs []error
	shareOK := c.Share > 0 && c.Share <= 1 // also rejects NaN
	if !shareOK {
		errs = append(errs, fmt.Errorf("%w, got %s", errSoftLimitShare, formatConfigFloat(c.Share)))
	}
	switch {
	case !(c.HeapTarget >= 0 && c.HeapTarget < 1): // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errHeapTarget, formatConfigFloat(c.HeapTarget)))
	case shareOK && c.HeapTarget != 0 && c.HeapTarget >= c.Share:
		errs = append(errs, fmt.Errorf("%w, got %s and share %s", errHeapTargetOverShare, formatConfigFloat(c.HeapTarget), formatConfigFloat(c.Share)))
	}
	return errors.Join(errs...)
}

func (c SoftLimitConfig) ownerConfig() softlimit.Config {
	return softlimit.Config{Enabled: c.Enabled, Share: c.Share, HeapTarget: c.HeapTarget}
}
