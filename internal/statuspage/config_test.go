// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

func TestConfig(t *testing.T) {
	cfg := DefaultConfig()
	require.NoError(t, confmap.Validate(&cfg))
	assert.Equal(t, "localhost:55680", cfg.NetAddr.Endpoint, "localhost: the page has no authentication")

	// Written as users do: the endpoint, and confighttp's own settings
	// beside it.
	require.NoError(t, confmap.NewFromStringMap(map[string]any{"endpoint": "", "read_timeout": "3s"}).Unmarshal(&cfg))
	assert.Equal(t, "3s", cfg.ReadTimeout.String())
	err := confmap.Validate(&cfg)
	require.ErrorIs(t, err, errEndpoint)
	assert.EqualError(t, err, "endpoint must not be empty")
}
