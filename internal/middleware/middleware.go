// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"errors"

	"github.com/otelthrottle/throttle/internal/admission"
)

// Config configures the HTTP and gRPC middleware.
type Config struct {
	// Classifier maps requests to signals. Required.
	Classifier *Classifier
	// Admission decides requests and bounds their bytes. Required; share
	// one between all servers of an extension.
	Admission *admission.Controller
	// Retry draws the announced retry delays. Nil means DefaultRetryFloor
	// to DefaultRetryCeiling.
	Retry *RetryDelay
	// Tarpit holds HTTP shed and budget rejections before they are
	// answered. Nil means none. Share one Tarpit between all servers of an
	// extension.
	Tarpit *Tarpit
	// Unclassified is told of every request whose HTTP path or gRPC method
	// is no known signal's: such requests are let through untouched, so a
	// receiver serving a custom path without a matching route is not
	// protected. Nil means nothing. Called on the request path: it must not
	// block.
	Unclassified func(p admission.Protocol, path string)
}

// settings is a validated Config with defaults applied.
type settings struct {
	cls        *Classifier
	adm        *admission.Controller
	retry      *RetryDelay
	tarpit     *Tarpit
	rejections *grpcRejections
	onUnknown  func(admission.Protocol, string)
}

var (
	errNoClassifier = errors.New("middleware: Classifier is required")
	errNoAdmission  = errors.New("middleware: Admission is required")
)

func newSettings(cfg Config) (settings, error) {
	if cfg.Classifier == nil {
		return settings{}, errNoClassifier
	}
	if cfg.Admission == nil {
		return settings{}, errNoAdmission
	}
	s := settings{cls: cfg.Classifier, adm: cfg.Admission, retry: cfg.Retry, tarpit: cfg.Tarpit, onUnknown: cfg.Unclassified}
	if s.retry == nil {
		s.retry = NewRetryDelay(DefaultRetryFloor, DefaultRetryCeiling, nil, nil)
	}
	s.rejections = newGRPCRejections(s.retry)
	return s, nil
}

// unclassified tells Config.Unclassified of a request no route matched.
func (s *settings) unclassified(p admission.Protocol, path string) {
	if s.onUnknown != nil {
		s.onUnknown(p, path)
	}
}
