// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage // import "github.com/otelthrottle/throttle/internal/statuspage"

import (
	"errors"

	"go.opentelemetry.io/collector/config/confighttp"
)

// defaultEndpoint is where the page listens when the status section is
// present without an endpoint. localhost, as the collector's own defaults:
// the page has no authentication.
const defaultEndpoint = "localhost:55680"

// Config is the status section: the HTTP server of the status page
// (GET /status as JSON, GET / as a page).
type Config struct {
	confighttp.ServerConfig `mapstructure:",squash"`
}

// DefaultConfig is the section's defaults: the collector's server defaults
// on localhost:55680.
func DefaultConfig() Config {
	cfg := confighttp.NewDefaultServerConfig()
	cfg.NetAddr.Endpoint = defaultEndpoint
	return Config{ServerConfig: cfg}
}

// errEndpoint: the collector puts the section's path before it.
var errEndpoint = errors.New("endpoint must not be empty")

// Validate checks the section; confighttp's own settings are validated by
// the collector with it.
func (c *Config) Validate() error {
	if c.NetAddr.Endpoint == "" {
		return errEndpoint
	}
	return nil
}
