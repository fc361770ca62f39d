// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

// TestRenderConfigThrottleYAML: -throttle-config replaces the throttle
// extension's settings, re-indented under extensions.throttle.
func TestRenderConfigThrottleYAML(t *testing.T) {
	b, err := renderConfig(colConfig{
		GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "benchmark",
		ThrottleYAML: "# a comment\nthresholds:\n  cpu: { enabled: true, enter: 0.92, exit: 0.85, hard: 1.10, breach_n: 3 }\nrules:\n  metrics: { enabled: false }\n",
	})
	require.NoError(t, err)
	ret, err := confmap.NewRetrievedFromYAML(b)
	require.NoError(t, err, string(b))
	conf, err := ret.AsConf()
	require.NoError(t, err, string(b))
	assert.Equal(t, 0.92, conf.Get("extensions::throttle::thresholds::cpu::enter"), string(b))
	assert.Equal(t, false, conf.Get("extensions::throttle::rules::metrics::enabled"))
	assert.False(t, conf.IsSet("extensions::throttle::thresholds::mem"), "the benchmark thresholds are replaced")
	assert.Equal(t, []any{map[string]any{"id": "throttle"}}, conf.Get("receivers::otlp::protocols::http::middlewares"))
}
