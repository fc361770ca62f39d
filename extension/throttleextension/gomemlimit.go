// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"math"

	"github.com/otelthrottle/throttle/internal/gomemlimit"
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

	// prevent unkeyed literal initialization
	_ struct{}
}

// errGoMemLimitShare is the error of a gomemlimit.share out of (0, 1].
var errGoMemLimitShare = errors.New("share must be in (0, 1]")

// Validate checks the section; the collector prefixes the field path.
func (c GoMemLimitConfig) Validate() error {
	if !(c.Share > 0 && c.Share <= 1) || math.IsNaN(c.Share) {
		return fmt.Errorf("%w, got %s", errGoMemLimitShare, formatConfigFloat(c.Share))
	}
	return nil
}

func (c GoMemLimitConfig) ownerConfig() gomemlimit.Config {
	return gomemlimit.Config{Enabled: c.Enabled, Share: c.Share}
}
