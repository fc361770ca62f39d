// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

func renderGateway(t *testing.T, c gatewayConfig) *confmap.Conf {
	t.Helper()
	b, err := colconfig.Render(gatewayTmpl, c)
	require.NoError(t, err)
	ret, err := confmap.NewRetrievedFromYAML(b)
	require.NoError(t, err, string(b))
	conf, err := ret.AsConf()
	require.NoError(t, err, string(b))
	return conf
}

// The hung-backend gateways: throttle with its downstream level reading
// the gateway's own metrics, and the stock one with no throttle at all;
// both with the queue they are given.
func TestGatewayConfigs(t *testing.T) {
	base := gatewayConfig{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Sink: "127.0.0.1:4"}
	c := renderGateway(t, base)
	assert.Equal(t, map[string]any{}, c.Get("extensions::throttle"), "shipped defaults")
	assert.False(t, c.IsSet("exporters::otlp_grpc::sending_queue"))

	ds := base
	ds.Downstream, ds.QueueSize = true, 10
	c = renderGateway(t, ds)
	assert.Equal(t, true, c.Get("extensions::throttle::downstream::enabled"))
	assert.Equal(t, "http://127.0.0.1:3/metrics", c.Get("extensions::throttle::downstream::endpoint"))
	assert.Equal(t, 10, c.Get("exporters::otlp_grpc::sending_queue::queue_size"))
	assert.False(t, c.IsSet("exporters::otlp_grpc::sending_queue::block_on_overflow"))
	assert.Equal(t, []any{map[string]any{"id": "throttle"}}, c.Get("receivers::otlp::protocols::grpc::middlewares"))

	// The capacity step's: a queue that waits when full.
	cp := base
	cp.QueueSize, cp.BlockOnOverflow = capacityQueueSize, true
	c = renderGateway(t, cp)
	assert.Equal(t, true, c.Get("exporters::otlp_grpc::sending_queue::block_on_overflow"))

	st := base
	st.Stock, st.QueueSize = true, 10
	c = renderGateway(t, st)
	assert.False(t, c.IsSet("extensions"))
	assert.False(t, c.IsSet("service::extensions"))
	assert.False(t, c.IsSet("receivers::otlp::protocols::http::middlewares"))
	assert.Equal(t, 10, c.Get("exporters::otlp_grpc::sending_queue::queue_size"))
}

// A hung sink takes the call and answers only once it resumes; a caller
// that gives up first gets an error and nothing is counted.
func TestSinkHang(t *testing.T) {
	s := &sink{clients: map[uint32]*arrivals{}}
	req := func() ptraceotlp.ExportRequest {
		td := ptrace.NewTraces()
		sp := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
		tid, sid := encodeIDs(1, 0)
		sp.SetTraceID(tid)
		sp.SetSpanID(sid)
		return ptraceotlp.NewExportRequestFromTraces(td)
	}
	resume := make(chan struct{})
	hanging := make(chan struct{})
	go func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { <-resume; cancel() }()
		close(hanging)
		s.hang(ctx, time.Hour)
	}()
	<-hanging
	require.Eventually(t, func() bool { return s.hung.Load() != nil }, 5*time.Second, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := s.Export(ctx, req())
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller gave up while the sink hung")
	assert.Zero(t, s.total())

	answered := make(chan error, 1)
	go func() {
		_, err := s.Export(context.Background(), req())
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("answered while hung (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(resume)
	require.NoError(t, <-answered)
	assert.EqualValues(t, 1, s.total(), "counted once resumed")
}

// A slow sink takes one call at a time and answers it after its spans'
// time; a caller that gives up, in its turn or waiting for it, gets an
// error, nothing is counted, and the next call has its turn.
func TestSinkSlow(t *testing.T) {
	s := &sink{clients: map[uint32]*arrivals{}, turn: make(chan struct{}, 1)}
	req := func(seq uint64) ptraceotlp.ExportRequest {
		td := ptrace.NewTraces()
		sp := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty()
		tid, sid := encodeIDs(1, seq)
		sp.SetTraceID(tid)
		sp.SetSpanID(sid)
		return ptraceotlp.NewExportRequestFromTraces(td)
	}
	perSpan := time.Hour
	s.slow.Store(&perSpan)

	first, cancelFirst := context.WithCancel(context.Background())
	answered := make(chan error, 1)
	go func() {
		_, err := s.Export(first, req(0))
		answered <- err
	}()
	require.Eventually(t, func() bool { return len(s.turn) == 1 }, 5*time.Second, time.Millisecond, "the first call has its turn")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := s.Export(ctx, req(1))
	require.ErrorIs(t, err, context.DeadlineExceeded, "the second gave up waiting for its turn")
	cancelFirst()
	require.ErrorIs(t, <-answered, context.Canceled, "the first gave up in its turn")
	assert.Zero(t, s.total())
	assert.Empty(t, s.turn, "its turn is given back")

	s.slow.Store(nil)
	_, err = s.Export(context.Background(), req(2))
	require.NoError(t, err)
	assert.EqualValues(t, 1, s.total(), "counted once the sink is no longer slow")
}
