// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"time"
)

// HoldConfig is the hold section: requests the throttle would refuse are
// held, unread, and decided again until they are admitted or have waited
// MaxWait (the middleware's hold says why). A gRPC request waits on its own
// goroutine once its handler starts, its message unread: a shed one for a
// decision that admits it, one that finds the admission budget full for
// its bytes (up to admission.wait_timeout); in Open a gRPC request is
// refused at once (a waiting stream buffers its message in the heap).
type HoldConfig struct {
	// MaxWait is the longest a request is held before it is refused; 0
	// turns holding off (refuse at once). Keep it well under the clients'
	// request timeout (the OTLP exporters' default is 30s). Default 5s; at
	// most 30s.
	MaxWait time.Duration `mapstructure:"max_wait"`
	// MaxRequests is how many requests are held at once (each costs its
	// goroutine and connection buffers, docs/design.md §7); beyond it a
	// request is refused at once. Default 256.
	MaxRequests int `mapstructure:"max_requests"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// TarpitConfig is the tarpit section: how long HTTP shed and budget
// rejections are held before they are answered. Open rejections, gRPC
// rejections, and requests whose body is over 256 KiB, of unknown length or
// compressed, or that wait for "100 Continue", are answered at once.
//
// Off by default: it helps against clients that ignore Retry-After and send
// uncompressed bodies (docs/results.md), but held rejections occupy the
// request slots of clients that share them between signals, exempt ones
// included, and the OTLP exporters compress (and honour Retry-After) by
// default.
type TarpitConfig struct {
	// Delay is how long a rejection is held, after its body has been read
	// and discarded, before the 429 is written. Default 0s = off; 1s is a
	// good start; at most 10s. A held request also delays the receiver's
	// shutdown by up to this long.
	Delay time.Duration `mapstructure:"delay"`
	// MaxRequests bounds the rejections held at once (each holds a
	// goroutine and a connection's buffers, plus a read buffer while its
	// body is read); beyond it they are answered at once. Default 512;
	// 0 = off.
	MaxRequests int `mapstructure:"max_requests"`

	// prevent unkeyed literal initialization
	_ struct{}
}

const (
	defaultHoldMaxWait     = 5 * time.Second
	defaultHoldMaxRequests = 256
	maxHoldMaxWait         = 30 * time.Second

	// maxTarpitDelay bounds how long a rejected client and a shutdown wait
	// on a held request.
	maxTarpitDelay = 10 * time.Second
	// defaultTarpitMaxRequests bounds the memory held rejections pin, a
	// goroutine and connection buffers each (docs/design.md §7), to a few
	// MiB.
	defaultTarpitMaxRequests = 512
)

// Errors of the hold and tarpit sections; the collector prefixes the field
// path.
var (
	errHoldMaxWait       = fmt.Errorf("max_wait must be between 0s and %v", maxHoldMaxWait)
	errHoldMaxRequests   = errors.New("max_requests must be >= 0")
	errTarpitDelay       = fmt.Errorf("delay must be between 0s and %v", maxTarpitDelay)
	errTarpitMaxRequests = errors.New("max_requests must be >= 0")
)

// Validate checks the section.
func (c HoldConfig) Validate() error {
	var errs []error
	if c.MaxWait < 0 || c.MaxWait > maxHoldMaxWait {
		errs = append(errs, fmt.Errorf("%w, got %v", errHoldMaxWait, c.MaxWait))
	}
	if c.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("%w, got %d", errHoldMaxRequests, c.MaxRequests))
	}
	return errors.Join(errs...)
}

// Validate checks the section.
func (c TarpitConfig) Validate() error {
	var errs []error
	if c.Delay < 0 || c.Delay > maxTarpitDelay {
		errs = append(errs, fmt.Errorf("%w, got %v", errTarpitDelay, c.Delay))
	}
	if c.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("%w, got %d", errTarpitMaxRequests, c.MaxRequests))
	}
	return errors.Join(errs...)
}
