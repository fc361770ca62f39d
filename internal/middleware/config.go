// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// The bounds of the middleware's sections.
const (
	// maxRetryAfter bounds the delay asked of refused clients: beyond a
	// minute it outlasts the retry window of most clients (an SDK's whole
	// export has 10s), which then drop the data instead of waiting.
	maxRetryAfter = time.Minute
	// maxTarpitDelay bounds how long a rejected client and a shutdown wait
	// on a held rejection.
	maxTarpitDelay = 10 * time.Second
	// DefaultTarpitMaxRequests bounds the memory held rejections pin, a
	// goroutine and connection buffers each, to a few MiB.
	DefaultTarpitMaxRequests = 512
)

// RetryConfig is the retry_after section: the range of the delay asked of
// refused clients, chosen by why they were refused.
type RetryConfig struct {
	// Min is the shortest delay. Default 1s.
	Min time.Duration `mapstructure:"min"`
	// Max is the longest delay. Default 5s; at most 1m.
	Max time.Duration `mapstructure:"max"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// TarpitConfig is the tarpit section: how long HTTP shed and budget
// rejections are held before they are answered. Open rejections, gRPC
// rejections, and requests whose body is over 256 KiB, of unknown length or
// compressed, or that wait for "100 Continue", are answered at once.
//
// Off by default: it helps against clients that ignore Retry-After and send
// uncompressed bodies, but held rejections occupy the request slots of
// clients that share them between signals, exempt ones included, and the
// OTLP exporters compress (and honour Retry-After) by default.
type TarpitConfig struct {
	// Delay is how long a rejection is held, after its body has been read
	// and discarded, before the 429 is written. Default 0s = off; 1s is a
	// good start; at most 10s.
	Delay time.Duration `mapstructure:"delay"`
	// MaxRequests bounds the rejections held at once (each holds a
	// goroutine and a connection's buffers, plus a read buffer while its
	// body is read); beyond it they are answered at once. Default 512;
	// 0 = off.
	MaxRequests int `mapstructure:"max_requests"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// RoutesConfig is the routes section: extra HTTP paths and gRPC methods
// and the signal each carries, for receivers the default OTLP routes do
// not cover.
type RoutesConfig struct {
	// HTTP maps a URL path (clean, starting with "/") to a signal name.
	HTTP map[string]string `mapstructure:"http"`
	// GRPC maps a full method name ("/pkg.Service/Method") to a signal name.
	GRPC map[string]string `mapstructure:"grpc"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// NewDefaultRetryConfig returns retry_after's defaults.
func NewDefaultRetryConfig() RetryConfig {
	return RetryConfig{Min: DefaultRetryFloor, Max: DefaultRetryCeiling}
}

// NewDefaultTarpitConfig returns the tarpit section's defaults: off.
func NewDefaultTarpitConfig() TarpitConfig {
	return TarpitConfig{MaxRequests: DefaultTarpitMaxRequests}
}

// Errors of the sections' Validate; the collector prefixes the section's
// path ("retry_after: min must be <= max").
var (
	ErrRetryAfterMin     = errors.New("min must be >= 0")
	ErrRetryAfterMax     = fmt.Errorf("max must be between 0s and %v: a longer delay outlasts the clients' retry windows", maxRetryAfter)
	ErrRetryAfterOrder   = errors.New("min must be <= max")
	ErrTarpitDelay       = fmt.Errorf("delay must be between 0s and %v", maxTarpitDelay)
	ErrTarpitMaxRequests = errors.New("max_requests must be >= 0")
	ErrUnknownSignal     = errors.New("unknown signal")
)

// Validate checks the range.
func (c RetryConfig) Validate() error {
	var errs []error
	if c.Min < 0 {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrRetryAfterMin, c.Min))
	}
	if c.Max < 0 || c.Max > maxRetryAfter {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrRetryAfterMax, c.Max))
	}
	if c.Min > c.Max {
		errs = append(errs, fmt.Errorf("%w, got %v and %v", ErrRetryAfterOrder, c.Min, c.Max))
	}
	return errors.Join(errs...)
}

// Validate checks the section.
func (c TarpitConfig) Validate() error {
	var errs []error
	if c.Delay < 0 || c.Delay > maxTarpitDelay {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrTarpitDelay, c.Delay))
	}
	if c.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("%w, got %d", ErrTarpitMaxRequests, c.MaxRequests))
	}
	return errors.Join(errs...)
}

// signalNames lists the signal names accepted as values of routes.
var signalNames = func() []string {
	names := make([]string, 0, decision.NumSignals)
	for s := range decision.NumSignals {
		names = append(names, s.String())
	}
	return names
}()

// Validate checks every route's key and its signal name, in key order.
func (c RoutesConfig) Validate() error {
	var errs []error
	check := func(kind, key string, keyErr error, sig string) {
		if keyErr != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", kind, key, keyErr))
		}
		if _, ok := decision.ParseSignal(sig); !ok {
			errs = append(errs, fmt.Errorf("%s %q: %w %q, want one of %s", kind, key, ErrUnknownSignal, sig, strings.Join(signalNames, ", ")))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(c.HTTP)) {
		check("http", p, CheckHTTPRoute(p), c.HTTP[p])
	}
	for _, m := range slices.Sorted(maps.Keys(c.GRPC)) {
		check("grpc", m, CheckGRPCRoute(m), c.GRPC[m])
	}
	return errors.Join(errs...)
}

// Routes are the section's routes by signal; names Validate rejects are
// left out.
func (c RoutesConfig) Routes() Routes {
	r := Routes{
		HTTP: make(map[string]decision.Signal, len(c.HTTP)),
		GRPC: make(map[string]decision.Signal, len(c.GRPC)),
	}
	for p, name := range c.HTTP {
		if s, ok := decision.ParseSignal(name); ok {
			r.HTTP[p] = s
		}
	}
	for m, name := range c.GRPC {
		if s, ok := decision.ParseSignal(name); ok {
			r.GRPC[m] = s
		}
	}
	return r
}
