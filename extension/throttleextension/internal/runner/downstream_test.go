// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// TestDownstreamDrivesTheState: with the downstream section on, the fill
// of an exporter's queue, read from the collector's metrics endpoint,
// moves every signal through Shedding to Open and back to Normal, with CPU
// and memory far below their lines; the exempt signals pass a full queue.
func TestDownstreamDrivesTheState(t *testing.T) {
	var size atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "otelcol_exporter_queue_size{data_type=\"traces\",exporter=\"otlp_grpc\"} %d\n", size.Load())
		fmt.Fprintf(w, "otelcol_exporter_queue_capacity{data_type=\"traces\",exporter=\"otlp_grpc\"} 100\n")
	}))
	defer srv.Close()

	src := testutil.NewSource(cgroup.Limits{QuotaCores: 1, MemLimit: 1 << 30})
	src.SetMemoryShare(0.1)
	src.SetCPUStep(time.Millisecond)
	cfg := testConfig(func(c *Config) {
		c.CheckInterval = 10 * time.Millisecond
		c.Downstream.Enabled = true
		c.Downstream.Endpoint = srv.URL + "/metrics"
		c.Downstream.Interval = 50 * time.Millisecond
		off := false
		c.Rules = decision.DefaultRulesConfig()
		c.Rules["logs"] = decision.RuleConfig{Enabled: &off}
	})
	r, err := New(cfg, componenttest.NewNopTelemetrySettings(), component.MustNewID("throttle"), Options{Source: src})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Shutdown(context.Background())) })
	require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))

	state := func(want decision.State, fill int64) {
		t.Helper()
		size.Store(fill)
		require.Eventually(t, func() bool { return r.State(decision.SignalTraces) == want }, 10*time.Second, 5*time.Millisecond,
			"queue %d%% full: traces never reached %v (now %v)", fill, want, r.State(decision.SignalTraces))
	}
	state(decision.StateNormal, 10)
	state(decision.StateShedding, 65) // enter 0.5
	state(decision.StateOpen, 85)     // hard 0.8
	assert.False(t, r.Decide(decision.SignalTraces).Admitted(), "a full queue refuses before decoding")
	assert.True(t, r.Decide(decision.SignalLogs).Admitted(), "an exempt signal passes a full queue")
	state(decision.StateShedding, 40) // below hard, above exit 0.3
	state(decision.StateNormal, 20)
}
