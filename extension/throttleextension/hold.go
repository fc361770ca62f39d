// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"errors"
	"fmt"
	"time"
)

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
	// maxTarpitDelay bounds how long a rejected client and a shutdown wait
	// on a held request.
	maxTarpitDelay = 10 * time.Second
	// defaultTarpitMaxRequests bounds the memory held rejections pin, a
	// goroutine and connection buffers each (docs/design.md §7), to a few
	// MiB.
	defaultTarpitMaxRequests = 512
)

// Errors of the tarpit section; the collector prefixes the field
// path.
var (
	errTarpitDelay       = fmt.Errorf("delay must be between 0s and %v", maxTarpitDelay)
	errTarpitMaxRequests = errors.New("max_requests must be >= 0")
)

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
