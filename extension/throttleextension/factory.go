// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/testseam"
)

// NewFactory returns the factory of the throttle extension (type "throttle").
func NewFactory() extension.Factory { return newFactory(factoryOptions{}) }

func newFactory(fo factoryOptions) extension.Factory {
	return extension.NewFactory(
		metadata.Type,
		createDefaultConfig,
		func(_ context.Context, set extension.Settings, cfg component.Config) (extension.Extension, error) {
			return newExtension(cfg.(*Config), set, fo)
		},
		metadata.ExtensionStability,
	)
}

func init() {
	testseam.RegisterExtensionFactory(func(src sampler.Source) extension.Factory {
		return newFactory(factoryOptions{source: src})
	})
}
