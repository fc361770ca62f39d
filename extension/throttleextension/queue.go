// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"time"
)

// QueueConfig is the queue section: HTTP requests the throttle would
// refuse are held, unread, and decided again until they are admitted or
// have waited MaxWait (middleware.Queue says why). gRPC requests the state
// refuses are not held: that decision runs on the connection's reader
// goroutine. A gRPC request that finds the admission budget full takes one
// of the MaxHeld places instead and waits for its bytes on its own
// goroutine, up to admission.wait_timeout, its message unread.
type QueueConfig struct {
	// MaxWait is the longest a request is held before it is refused; 0
	// turns the queue off (refuse at once). Keep it well under the
	// clients' request timeout (the OTLP exporters' default is 30s).
	MaxWait time.Duration `mapstructure:"max_wait"`
	// MaxHeld is how many requests are held at once (each costs its
	// goroutine and connection buffers, about 20 KiB); beyond it a request
	// is refused at once.
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
	ErrQueueMaxWait = errors.New("max_wait must be between 0s and 30s")
	ErrQueueMaxHeld = errors.New("max_held must be >= 0")
)

// Validate checks the section.
func (c QueueConfig) Validate() error {
	var errs []error
	if c.MaxWait < 0 || c.MaxWait > maxQueueMaxWait {
		errs = append(errs, ErrQueueMaxWait)
	}
	if c.MaxHeld < 0 {
		errs = append(errs, ErrQueueMaxHeld)
	}
	return errors.Join(errs...)
}
