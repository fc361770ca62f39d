package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

func TestRenderConfigs(t *testing.T) {
	parse := func(b []byte) *confmap.Conf {
		t.Helper()
		ret, err := confmap.NewRetrievedFromYAML(b)
		require.NoError(t, err, string(b))
		conf, err := ret.AsConf()
		require.NoError(t, err, string(b))
		return conf
	}
	b, err := colconfig.Render(sinkTmpl, sinkConfig{HTTPPort: 1, GRPCPort: 2, MetricsPort: 3})
	require.NoError(t, err)
	assert.Equal(t, []any{"nop"}, parse(b).Get("service::pipelines::traces::exporters"))

	for _, exp := range []string{"otlp_http", "otlp_grpc"} {
		b, err := colconfig.Agent{Bench: "bench/fleet", HTTPPort: 1, MetricsPort: 2, Exporter: exp, Endpoint: "127.0.0.1:9"}.Render()
		require.NoError(t, err)
		conf := parse(b)
		assert.Equal(t, []any{"batch"}, conf.Get("service::pipelines::traces::processors"))
		assert.Equal(t, []any{exp}, conf.Get("service::pipelines::traces::exporters"))
		// As users run them: the exporter's defaults (gzip, queue, retry).
		assert.False(t, conf.IsSet("exporters::"+exp+"::sending_queue"))
		assert.False(t, conf.IsSet("exporters::"+exp+"::compression"))

		b, err = colconfig.Agent{Bench: "bench/fleet", HTTPPort: 1, MetricsPort: 2, Exporter: exp, Endpoint: "127.0.0.1:9", Compression: "none"}.Render()
		require.NoError(t, err)
		assert.Equal(t, "none", parse(b).Get("exporters::"+exp+"::compression"))
	}

	// The tier's remedy for gRPC clients that never reconnect.
	b, err = colconfig.Gateway{
		Kind: colconfig.KindThrottle, HTTPPort: 1, GRPCPort: 2, MetricsPort: 3, PprofPort: 4, SinkHTTPPort: 5,
		MaxConnectionAge: 30 * time.Second, MaxConnectionAgeGrace: 10 * time.Second,
	}.Render()
	require.NoError(t, err)
	conf := parse(b)
	assert.Equal(t, "30s", conf.Get("receivers::otlp::protocols::grpc::keepalive::server_parameters::max_connection_age"))
	assert.Equal(t, "10s", conf.Get("receivers::otlp::protocols::grpc::keepalive::server_parameters::max_connection_age_grace"))
	b, err = colconfig.Gateway{Kind: colconfig.KindThrottle, HTTPPort: 1, GRPCPort: 2, MetricsPort: 3, PprofPort: 4, SinkHTTPPort: 5}.Render()
	require.NoError(t, err)
	assert.False(t, parse(b).IsSet("receivers::otlp::protocols::grpc::keepalive"), "none unless asked for")

	for _, kind := range kinds {
		b, err := colconfig.Gateway{
			Kind: kind, HTTPPort: 1, GRPCPort: 2, MetricsPort: 3, PprofPort: 4,
			SinkHTTPPort: 5, MemoryLimiter: colconfig.MemoryLimiterYAML,
		}.Render()
		require.NoError(t, err)
		conf := parse(b)
		procs := []any{"batch"}
		if kind == colconfig.KindMemoryLimiter {
			procs = []any{"memory_limiter", "batch"}
		}
		assert.Equal(t, procs, conf.Get("service::pipelines::traces::processors"), kind)
		mw := conf.Get("receivers::otlp::protocols::http::middlewares")
		switch kind {
		case colconfig.KindThrottle:
			assert.Equal(t, []any{map[string]any{"id": "throttle"}}, mw)
			assert.True(t, conf.IsSet("extensions::throttle"), "shipped defaults: an empty throttle section")
		case colconfig.KindMLExt:
			assert.Equal(t, []any{map[string]any{"id": "memory_limiter"}}, mw)
			assert.Equal(t, 80, conf.Get("extensions::memory_limiter::limit_percentage"))
		default:
			assert.Nil(t, mw, kind)
		}
	}
}
