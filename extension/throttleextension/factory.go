// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
)

// NewFactory returns the factory of the throttle extension (type "throttle").
// Options are for tests and embedders; a distribution calls it without any.
func NewFactory(opts ...Option) extension.Factory {
	var fo factoryOptions
	for _, o := range opts {
		o(&fo)
	}
	return extension.NewFactory(
		metadata.Type,
		createDefaultConfig,
		func(_ context.Context, set extension.Settings, cfg component.Config) (extension.Extension, error) {
			return newExtension(cfg.(*Config), set, fo)
		},
		metadata.ExtensionStability,
	)
}
