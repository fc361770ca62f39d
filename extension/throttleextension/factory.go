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
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// NewFactory returns the factory of the throttle extension (type "throttle").
func NewFactory() extension.Factory { return newFactory(factoryOptions{}) }

// factory is the extension's factory. Its WithSource is how this
// repository's tests outside the package inject a resource source
// (throttleapi.SourceFactory, internal/testseam).
type factory struct {
	extension.Factory
	opts factoryOptions
}

var _ throttleapi.SourceFactory = factory{}

func newFactory(fo factoryOptions) factory {
	return factory{
		Factory: extension.NewFactory(
			metadata.Type,
			createDefaultConfig,
			func(_ context.Context, set extension.Settings, cfg component.Config) (extension.Extension, error) {
				return newExtension(cfg.(*Config), set, fo)
			},
			metadata.ExtensionStability,
		),
		opts: fo,
	}
}

// WithSource implements throttleapi.SourceFactory.
func (f factory) WithSource(src sampler.Source) extension.Factory {
	fo := f.opts
	fo.source = src
	return newFactory(fo)
}

// resourceSource is where the sampler reads CPU and memory usage: the cgroup
// reader or the process fallback in production. Tests inject their own
// (factoryOptions.source, or WithSource from outside the package).
type resourceSource = sampler.Source

// factoryOptions are the factory's test seams.
type factoryOptions struct {
	source resourceSource
	// memoryLimit stands in for the runtime's soft memory limit (tests
	// only); nil: debug.SetMemoryLimit, and only with the default source.
	memoryLimit func(int64) int64
	// limitsEvery is how often limits are re-read (tests only); 0: the
	// sampler's default.
	limitsEvery time.Duration
}
