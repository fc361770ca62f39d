// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package downstream

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultConfigValid(t *testing.T) {
	c := DefaultConfig()
	require.NoError(t, c.Validate())
	c.Enabled = true
	require.NoError(t, c.Validate(), "the defaults must be valid once switched on")
}

func TestConfigValidate(t *testing.T) {
	f := func(mut func(*Config), want string) {
		t.Helper()
		c := DefaultConfig()
		c.Enabled = true
		mut(&c)
		err := c.Validate()
		if want == "" {
			assert.NoError(t, err)
			return
		}
		require.Error(t, err)
		assert.Contains(t, err.Error(), want)
	}
	f(func(*Config) {}, "")
	f(func(c *Config) { c.Endpoint = "localhost:8888/metrics" }, "endpoint must be an http:// or https:// URL")
	f(func(c *Config) { c.Endpoint = "" }, "endpoint must be")
	f(func(c *Config) { c.Endpoint = "https://collector:8888/metrics" }, "")
	f(func(c *Config) { c.Interval = 10 * time.Millisecond }, "interval must be between 50ms and 5s, got 10ms")
	f(func(c *Config) { c.Interval = time.Minute }, "interval must be between")
	f(func(c *Config) { c.Exporters = []string{"otlp_grpc/backend", "otlp"} }, "")
	f(func(c *Config) { c.Exporters = []string{"not an id"} }, `exporters: each entry must be an exporter's component ID (type[/name]), got "not an id"`)
	f(func(c *Config) { c.Hard = 80 }, "the downstream lines are a share of the queue's capacity")
	f(func(c *Config) { c.Exit, c.Enter = 0.6, 0.5 }, "exit must be < enter")
	f(func(c *Config) { c.BreachDuration = 5 * time.Second }, "breach_duration must be between 0s and 2s")
}

func TestConfigValidateDisabled(t *testing.T) {
	c := DefaultConfig()
	c.Hard = 80 // lines are not checked while off
	require.NoError(t, c.Validate())
	c.Endpoint = "not a url"
	require.ErrorContains(t, c.Validate(), "endpoint must be", "a typo fails at start, not on the day it is switched on")
}
