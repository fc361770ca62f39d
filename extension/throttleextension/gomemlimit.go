// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"math"

	"github.com/otelthrottle/throttle/internal/softlimit"
)

// GoMemLimitConfig is the gomemlimit section: whether the throttle sets the
// Go runtime's soft memory limit (GOMEMLIMIT) from the container's memory
// limit, and to what share of it. The throttle never overrides a limit set
// by the GOMEMLIMIT environment variable or by anything else in the
// process, and gives the limit back at shutdown.
type GoMemLimitConfig struct {
	// Enabled lets the throttle set the limit when nobody else has.
	// Default true.
	Enabled bool `mapstructure:"enabled"`
	// Share of the memory limit the soft limit is set to, in (0, 1].
	// Default 0.80.
	Share float64 `mapstructure:"share"`
	// HeapTarget is the share of the memory limit the working set may
	// reach between two collections while what is live is small: the
	// throttle raises the GC's pace (GOGC) to let the heap grow into it,
	// never below GOGC's default, only while a soft memory limit is in
	// force and GOGC is not set, and gives the default back at shutdown.
	// In [0, 1); keep it under share. Default 0.50; 0 leaves GOGC alone.
	HeapTarget float64 `mapstructure:"heap_target"`

	// prevent unkeyed literal initialization
	_ struct{}
}

var (
	// errGoMemLimitShare is the error of a gomemlimit.share out of (0, 1].
	errGoMemLimitShare = errors.New("share must be in (0, 1]")
	// errHeapTarget is the error of a gomemlimit.heap_target out of [0, 1).
	errHeapTarget = errors.New("heap_target must be in [0, 1)")
)

// Validate checks the section; the collector prefixes the field path.
func (c GoMemLimitConfig) Validate() error {
	var errs []error
	if !(c.Share > 0 && c.Share <= 1) || math.IsNaN(c.Share) {
		errs = append(errs, fmt.Errorf("%w, got %s", errGoMemLimitShare, formatConfigFloat(c.Share)))
	}
	if !(c.HeapTarget >= 0 && c.HeapTarget < 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", errHeapTarget, formatConfigFloat(c.HeapTarget)))
	}
	return errors.Join(errs...)
}

func (c GoMemLimitConfig) ownerConfig() softlimit.Config {
	return softlimit.Config{Enabled: c.Enabled, Share: c.Share, HeapTarget: c.HeapTarget}
}
