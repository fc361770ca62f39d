// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"time"
)

// QueueConfig is the queue section: requests the throttle would refuse are
// held, unread, and decided again until they are admitted or have waited
// MaxWait (middleware.Queue says why). A gRPC request waits on its own
// goroutine once its handler starts, its message unread: a shed one for a
// decision that admits it, one that finds the admission budget full for
// its bytes (up to admission.wait_timeout); in Open a gRPC request is
// refused at once (a waiting stream buffers its message in the heap).
type QueueConfig struct {
	// MaxWait is the longest a request is held before it is refused; 0
	// turns the queue off (refuse at once). Keep it well under the
	// clients' request timeout (the OTLP exporters' default is 30s).
	MaxWait time.Duration `mapstructure:"max_wait"`
	// MaxHeld is how many requests are held at once (each costs its
	// goroutine and connection buffers, docs/design.md §7); beyond it a
	// request is refused at once.
	MaxHeld int `mapstructure:"max_held"`

	// prevent unkeyed literal initialization
	_ struct{}
}

const (
	defaultQueueMaxWait = 5 * time.Second
	defaultQueueMaxHeld = 256
	maxQueueMaxWait     = 30 * time.Second
)

// Errors of the queue section; the collector prefixes the field path.
var (
	errQueueMaxWait = fmt.Errorf("max_wait must be between 0s and %v", maxQueueMaxWait)
	errQueueMaxHeld = errors.New("max_held must be >= 0")
)

// Validate checks the section.
func (c QueueConfig) Validate() error {
	var errs []error
	if c.MaxWait < 0 || c.MaxWait > maxQueueMaxWait {
		errs = append(errs, fmt.Errorf("%w, got %v", errQueueMaxWait, c.MaxWait))
	}
	if c.MaxHeld < 0 {
		errs = append(errs, fmt.Errorf("%w, got %d", errQueueMaxHeld, c.MaxHeld))
	}
	return errors.Join(errs...)
}
