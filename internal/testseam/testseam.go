// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package testseam lets this repository's tests (the processor's, the
// testbed's) build the throttle extension's factory with an injected
// resource source, so that they drive the water level through the real
// sampler and state machines, without widening the extension's public API:
// a distribution sees only throttleextension.NewFactory.
package testseam // import "github.com/otelthrottle/throttle/internal/testseam"

import (
	"go.opentelemetry.io/collector/extension"

	"github.com/otelthrottle/throttle/internal/sampler"
)

var extensionFactory func(sampler.Source) extension.Factory

// RegisterExtensionFactory is called by the extension's package at init.
func RegisterExtensionFactory(f func(sampler.Source) extension.Factory) { extensionFactory = f }

// ExtensionFactory returns the throttle extension's factory reading its
// resources from src. The caller must import the extension's package.
func ExtensionFactory(src sampler.Source) extension.Factory {
	if extensionFactory == nil {
		panic("testseam: import github.com/otelthrottle/throttle/extension/throttleextension")
	}
	return extensionFactory(src)
}
