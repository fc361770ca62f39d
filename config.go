// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor // import "github.com/otelthrottle/throttle"

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/collector/component"
)

// OnReject is what the processor does with a batch the throttle rejects.
type OnReject string

const (
	// OnRejectRefuse returns a retryable ResourceExhausted error with a
	// RetryInfo delay to the receiver, which hands it to the client (HTTP 429
	// + Retry-After, gRPC RESOURCE_EXHAUSTED) so that the client retries.
	OnRejectRefuse OnReject = "refuse"
	// OnRejectDrop drops the batch, counts it, and reports success upstream.
	// For receivers whose sources cannot retry (or must not be blocked).
	OnRejectDrop OnReject = "drop"
)

// defaultExtensionID is the ID of the throttle extension the processor
// follows when `extension` is not set. The extension's type is written out
// here because its metadata package is internal to the extension.
var defaultExtensionID = component.NewID(component.MustNewType("throttle"))

// Config is the configuration of the throttle processor.
type Config struct {
	// Extension is the component ID of the throttle extension whose
	// decisions the processor applies.
	Extension component.ID `mapstructure:"extension"`
	// OnReject is "refuse" (default) or "drop".
	OnReject OnReject `mapstructure:"on_reject"`

	// prevent unkeyed literal initialization
	_ struct{}
}

var _ component.Config = (*Config)(nil)

var (
	errNoExtension     = errors.New("extension must be set to the ID of a throttle extension")
	errInvalidOnReject = fmt.Errorf("on_reject must be %q or %q", OnRejectRefuse, OnRejectDrop)
)

// Validate checks the configuration.
func (cfg *Config) Validate() error {
	var errs error
	if cfg.Extension == (component.ID{}) {
		errs = errors.Join(errs, errNoExtension)
	}
	switch cfg.OnReject {
	case OnRejectRefuse, OnRejectDrop:
	default:
		errs = errors.Join(errs, fmt.Errorf("%w, got %q", errInvalidOnReject, cfg.OnReject))
	}
	return errs
}

func createDefaultConfig() component.Config {
	return &Config{
		Extension: defaultExtensionID,
		OnReject:  OnRejectRefuse,
	}
}
