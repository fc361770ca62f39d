// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package e2edata holds what the end-to-end tests of both modules share:
// the telemetry they send through real exporters and count at a sink, the
// reading of the throttle's request counter, and of a refusal's retry hint.
package e2edata // import "github.com/otelthrottle/throttle/internal/e2edata"

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Traces returns n spans spread over two resources, so that counting at a sink
// covers more than the first one.
func Traces(n int) ptrace.Traces {
	td := ptrace.NewTraces()
	a := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	b := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		sp := s.AppendEmpty()
		sp.SetName("span")
		sp.SetTraceID([16]byte{1, byte(i >> 8), byte(i)})
		sp.SetSpanID([8]byte{2, byte(i >> 8), byte(i)})
	}
	return td
}

// Metrics returns n gauge points spread over two resources, so that counting at a sink
// covers more than the first one.
func Metrics(n int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	a := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	b := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics().AppendEmpty()
	a.SetName("a")
	b.SetName("b")
	ga, gb := a.SetEmptyGauge().DataPoints(), b.SetEmptyGauge().DataPoints()
	for i := range n {
		g := ga
		if i%2 == 1 {
			g = gb
		}
		g.AppendEmpty().SetIntValue(int64(i))
	}
	return md
}

// Logs returns n log records spread over two resources, so that counting at a sink
// covers more than the first one.
func Logs(n int) plog.Logs {
	ld := plog.NewLogs()
	a := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
	b := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
	for i := range n {
		l := a
		if i%2 == 1 {
			l = b
		}
		l.AppendEmpty().Body().SetStr("log")
	}
	return ld
}

// Profiles returns n profile samples spread over two resources, so that counting at a sink
// covers more than the first one.
func Profiles(n int) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	a := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty().Samples()
	b := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty().Samples()
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		s.AppendEmpty()
	}
	return pd
}

// Requests is the otelcol_throttle_requests counter in tel for one protocol,
// signal and decision ("allowed", or "denied" with a reason), ignoring any
// other attribute; 0 before the first decision.
func Requests(tb testing.TB, tel *componenttest.Telemetry, protocol, signal, decision, reason string) int64 {
	tb.Helper()
	return counter(tb, tel, "otelcol_throttle_requests",
		"protocol", protocol, "signal", signal, "decision", decision, "reason", reason)
}

// CutOffs is the otelcol_throttle_cut_off_requests counter in tel for one
// protocol, signal and reason; 0 before the first cut-off.
func CutOffs(tb testing.TB, tel *componenttest.Telemetry, protocol, signal, reason string) int64 {
	tb.Helper()
	return counter(tb, tel, "otelcol_throttle_cut_off_requests", "protocol", protocol, "signal", signal, "reason", reason)
}

// counter sums the points of the integer counter name in tel whose
// attributes match kv, pairs of a key and its value ("" for absent); 0
// before the counter has a point.
func counter(tb testing.TB, tel *componenttest.Telemetry, name string, kv ...string) int64 {
	tb.Helper()
	m, err := tel.GetMetric(name)
	if err != nil {
		return 0
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.Truef(tb, ok, "%s is a %T", name, m.Data)
	var total int64
points:
	for _, dp := range sum.DataPoints {
		for i := 0; i+1 < len(kv); i += 2 {
			if !AttrIs(dp.Attributes, kv[i], kv[i+1]) {
				continue points
			}
		}
		total += dp.Value
	}
	return total
}

// AttrIs reports whether the attribute key has value want, or is absent
// when want is "".
func AttrIs(set attribute.Set, key, want string) bool {
	v, ok := set.Value(attribute.Key(key))
	if want == "" {
		return !ok
	}
	return ok && v.AsString() == want
}

// RetryInfo is the gRPC code of err, a refusal, and the delay of its
// RetryInfo; it fails tb when err carries none.
func RetryInfo(tb testing.TB, err error) (codes.Code, time.Duration) {
	tb.Helper()
	st, ok := status.FromError(err)
	require.True(tb, ok, "not a gRPC status error: %v", err)
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return st.Code(), ri.GetRetryDelay().AsDuration()
		}
	}
	require.FailNow(tb, "no RetryInfo", "%v", st.Details())
	return 0, 0
}
