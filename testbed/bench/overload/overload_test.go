// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

func TestRenderConfig(t *testing.T) {
	for _, c := range []colConfig{
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "default"},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "benchmark"},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, MemoryLimiter: true},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, PprofPort: 4},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "default", PprofPort: 4},
	} {
		b, err := renderConfig(c)
		require.NoError(t, err)
		ret, err := confmap.NewRetrievedFromYAML(b)
		require.NoError(t, err, string(b))
		conf, err := ret.AsConf()
		require.NoError(t, err, string(b))
		assert.Equal(t, "127.0.0.1:2", conf.Get("receivers::otlp::protocols::http::endpoint"))
		assert.Equal(t, "127.0.0.1:1", conf.Get("receivers::otlp::protocols::grpc::endpoint"))
		assert.Equal(t, 3, conf.Get("service::telemetry::metrics::readers").([]any)[0].(map[string]any)["pull"].(map[string]any)["exporter"].(map[string]any)["prometheus"].(map[string]any)["port"])
		for _, p := range []string{"traces", "metrics", "logs"} {
			want := []any{"batch"}
			if c.MemoryLimiter {
				want = []any{"memory_limiter", "batch"}
			}
			assert.Equal(t, want, conf.Get("service::pipelines::"+p+"::processors"), p)
			assert.Equal(t, []any{"nop"}, conf.Get("service::pipelines::"+p+"::exporters"), p)
		}
		assert.Equal(t, c.Throttle, conf.IsSet("extensions::throttle"))
		assert.Equal(t, c.Throttle, conf.IsSet("receivers::otlp::protocols::http::middlewares"))
		if c.Throttle {
			assert.Equal(t, false, conf.Get("extensions::throttle::rules::metrics::enabled"))
		}
		if c.Thresholds == "benchmark" {
			assert.Equal(t, 1.2, conf.Get("extensions::throttle::cpu::hard"))
		}
		var exts []any
		if c.Throttle {
			exts = append(exts, "throttle")
		}
		if c.PprofPort != 0 {
			exts = append(exts, "pprof")
			assert.Equal(t, "127.0.0.1:4", conf.Get("extensions::pprof::endpoint"))
		} else {
			assert.False(t, conf.IsSet("extensions::pprof"))
		}
		if exts == nil {
			assert.False(t, conf.IsSet("service::extensions"), string(b))
		} else {
			assert.Equal(t, exts, conf.Get("service::extensions"), string(b))
		}
	}
}
