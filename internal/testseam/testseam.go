// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package testseam builds the throttle extension's factory with an injected
// resource source for this repository's tests outside the extension's
// package (the processor's, the testbed's), so that they drive the water
// level through the real sampler and state machines, without widening the
// extension's public API: a distribution sees only
// throttleextension.NewFactory.
package testseam // import "github.com/otelthrottle/throttle/internal/testseam"

import (
	"go.opentelemetry.io/collector/extension"

	"github.com/otelthrottle/throttle/extension/throttleextension"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// ExtensionFactory returns the throttle extension's factory reading its
// resources from src.
func ExtensionFactory(src sampler.Source) extension.Factory {
	return throttleextension.NewFactory().(throttleapi.SourceFactory).WithSource(src)
}
