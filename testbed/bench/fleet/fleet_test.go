package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
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

// TestFleetThrottleDelivers is the fleet benchmark in the normal test suite,
// short: two stock agents (otlp_http with its defaults) forward a burst to a
// gateway with throttle's shipped defaults in a cgroup of 0.2 CPU and 100
// MiB, which exports to a sink. It asserts what a fleet relies on, not
// throughput, which depends on the machine: no OOM kill, no restart, no
// Open left standing, and after the drain every span an agent accepted is
// at the sink, nothing acknowledged by the gateway is lost.
//
// Skipped with -short, off Linux, without root, or where no cgroup can be
// created.
func TestFleetThrottleDelivers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds two distributions and runs a fleet for about two minutes")
	}
	harness.RequireCgroups(t)
	harness.TakeMachine(t)
	o := defaultOptions()
	o.throttleBin = distbuild.Binary(t)
	o.stockBin = distbuild.Stock(t)
	o.out = t.TempDir()
	o.agents, o.cpus, o.memMiB = 2, 0.2, 100
	// Above what 0.2 CPU exports on any machine this runs on: the point is
	// the overload, not its exact factor.
	o.capacity, o.factor = 12000, 2
	o.warmup, o.burst, o.drainMax, o.settle = 3*time.Second, 20*time.Second, 2*time.Minute, 5*time.Second

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	tl, err := harness.CreateCSV(filepath.Join(o.out, "timeline.csv"), timelineHeader)
	require.NoError(t, err)
	defer tl.Close()
	sum, err := runScenario(ctx, o, scenario{name: colconfig.KindThrottle, kind: colconfig.KindThrottle}, tl)
	require.NoError(t, err, "files in %s", o.out)
	t.Logf("delivered %.2f%% (%d of %d), gateway lost %d, burst %.0f spans/s to the sink, OOM kills %d, restarts %d, peak working set %.1f%%, Open %.0f s, Shedding %.0f s, drained %s",
		sum.DeliveredPct, sum.SinkSpans, sum.AgentAccepted, sum.Lost, sum.BurstSinkRate, sum.OOMKills, sum.Restarts,
		sum.PeakWSPct, sum.OpenSeconds, sum.SheddingSeconds, sum.drainNote())

	if sum.SheddingSeconds == 0 && sum.OpenSeconds == 0 {
		t.Skipf("the load could not overload the gateway on this machine (burst %.0f spans/s reached the sink): nothing to assert about the throttle", sum.BurstSinkRate)
	}
	assert.Zero(t, sum.OOMKills, "OOM kills")
	assert.Zero(t, sum.Restarts, "restarts")
	assert.GreaterOrEqual(t, sum.DrainSeconds, 0.0, "the fleet did not drain within %s", o.drainMax)
	assert.Positive(t, sum.AgentAccepted)
	assert.Equal(t, sum.AgentAccepted, sum.SinkSpans, "every span an agent accepted reaches the sink")
	assert.Zero(t, sum.Lost, "nothing the gateway acknowledged is lost")
	assert.Zero(t, sum.AgentEnqueueFailed+sum.AgentSendFailed, "the agents dropped nothing")
	last := sum.points[len(sum.points)-1]
	assert.NotEqual(t, 2.0, last.state, "Open left standing after the drain")
}
