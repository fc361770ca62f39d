// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"context"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// NewFactory returns the factory of the throttle extension (type "throttle").
func NewFactory() extension.Factory { return newFactory(factoryOptions{}) }

func newFactory(fo factoryOptions) extension.Factory {
	return extension.NewFactory(
		metadata.Type,
		createDefaultConfig,
		func(ctx context.Context, set extension.Settings, cfg component.Config) (extension.Extension, error) {
			if src := sampler.SourceFromContext(ctx); src != nil {
				fo.source = src
			}
			return newExtension(cfg.(*Config), set, fo)
		},
		metadata.ExtensionStability,
	)
}

// factoryOptions are the factory's test seams; tests outside the package
// set the source with sampler.ContextWithSource.
type factoryOptions struct {
	// source is where the sampler reads CPU and memory usage; nil: the
	// cgroup reader or the process fallback.
	source sampler.Source
	// processSource stands in for this process's cgroup or counters: unlike
	// source, the extension takes it for its own, and closes it at
	// Shutdown.
	processSource sampler.Source
	// memoryLimit stands in for the runtime's soft memory limit setter;
	// nil: debug.SetMemoryLimit, and only with this process's source.
	memoryLimit func(int64) int64
	// limitsEvery is how often limits are re-read; 0: the sampler's
	// default.
	limitsEvery time.Duration
}
