// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package e2e // import "github.com/otelthrottle/throttle/testbed/test/internal/e2e"

import (
	"context"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"

	"github.com/otelthrottle/throttle/extension/throttleextension"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// ExtensionFactory is the throttle extension's own factory, whose
// extensions read their resources from src instead of the container's
// cgroup: a test drives their water level through src, and the real
// sampler and state machines follow it. The extension finds src in the
// context it is created with (sampler.ContextWithSource); it leaves the
// soft memory limit and the GC percent alone then.
func ExtensionFactory(src sampler.Source) extension.Factory {
	f := throttleextension.NewFactory()
	return extension.NewFactory(f.Type(), f.CreateDefaultConfig,
		func(ctx context.Context, set extension.Settings, cfg component.Config) (extension.Extension, error) {
			return f.Create(sampler.ContextWithSource(ctx, src), set, cfg)
		},
		f.Stability())
}
