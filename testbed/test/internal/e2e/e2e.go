// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package e2e holds what the end-to-end tests of throttle share: free ports,
// config templates, OTLP payloads and clients, and a Prometheus scrape
// parser. It is test support code only; no component imports it.
package e2e // import "github.com/otelthrottle/throttle/testbed/test/internal/e2e"

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/otelthrottle/throttle/testbed/internal/series"
)

// Ports are the free ports a collector config template is filled with.
type Ports struct {
	GRPCPort    int
	HTTPPort    int
	MetricsPort int
	HealthPort  int
	ZPagesPort  int
	StatusPort  int
}

// FreePorts picks free TCP ports on 127.0.0.1: it listens on port 0 for every
// field at once (so they differ), then closes the listeners. Another process
// could take one before the collector binds it; on a test machine that is
// rare enough, and far better than fixed ports.
func FreePorts(tb testing.TB) Ports {
	tb.Helper()
	const n = 6
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(tb, err)
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return Ports{GRPCPort: ports[0], HTTPPort: ports[1], MetricsPort: ports[2], HealthPort: ports[3], ZPagesPort: ports[4], StatusPort: ports[5]}
}

// Render fills the Go text/template in file tmplPath with data and returns the
// result.
func Render(tb testing.TB, tmplPath string, data any) []byte {
	tb.Helper()
	tmpl, err := template.New(filepath.Base(tmplPath)).Option("missingkey=error").ParseFiles(tmplPath)
	require.NoError(tb, err)
	var buf bytes.Buffer
	require.NoError(tb, tmpl.Execute(&buf, data))
	return buf.Bytes()
}

// RenderFile renders tmplPath with data into a file of tb.TempDir() named
// after the template without its .tmpl suffix and returns its path.
func RenderFile(tb testing.TB, tmplPath string, data any) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), strings.TrimSuffix(filepath.Base(tmplPath), ".tmpl"))
	require.NoError(tb, os.WriteFile(out, Render(tb, tmplPath, data), 0o600))
	return out
}

// Traces returns one resource with n spans.
func Traces(n int) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "throttle-e2e")
	ss := rs.ScopeSpans().AppendEmpty()
	now := time.Now()
	for i := range n {
		s := ss.Spans().AppendEmpty()
		s.SetName("span-" + strconv.Itoa(i))
		s.SetTraceID(pcommon.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
		s.SetSpanID(pcommon.SpanID{1, 2, 3, 4, 5, 6, 7, byte(i + 1)})
		s.SetStartTimestamp(pcommon.NewTimestampFromTime(now.Add(-time.Second)))
		s.SetEndTimestamp(pcommon.NewTimestampFromTime(now))
	}
	return td
}

// Metrics returns one resource with n gauges of one data point each.
func Metrics(n int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.name", "throttle-e2e")
	sm := rm.ScopeMetrics().AppendEmpty()
	for i := range n {
		m := sm.Metrics().AppendEmpty()
		m.SetName("e2e.gauge." + strconv.Itoa(i))
		dp := m.SetEmptyGauge().DataPoints().AppendEmpty()
		dp.SetIntValue(int64(i))
		dp.SetTimestamp(pcommon.NewTimestampFromTime(time.Now()))
	}
	return md
}

// Logs returns one resource with n log records.
func Logs(n int) plog.Logs {
	ld := plog.NewLogs()
	rl := ld.ResourceLogs().AppendEmpty()
	rl.Resource().Attributes().PutStr("service.name", "throttle-e2e")
	sl := rl.ScopeLogs().AppendEmpty()
	for i := range n {
		r := sl.LogRecords().AppendEmpty()
		r.Body().SetStr("log " + strconv.Itoa(i))
		r.SetTimestamp(pcommon.NewTimestampFromTime(time.Now()))
	}
	return ld
}

// PostTraces sends td as an OTLP/HTTP protobuf request to
// http://addr/v1/traces and returns the status code and body.
func PostTraces(ctx context.Context, addr string, td ptrace.Traces) (int, []byte, error) {
	body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if err != nil {
		return 0, nil, err
	}
	return post(ctx, "http://"+addr+"/v1/traces", body)
}

// PostMetrics sends md as an OTLP/HTTP protobuf request to
// http://addr/v1/metrics and returns the status code and body.
func PostMetrics(ctx context.Context, addr string, md pmetric.Metrics) (int, []byte, error) {
	body, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		return 0, nil, err
	}
	return post(ctx, "http://"+addr+"/v1/metrics", body)
}

func post(ctx context.Context, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(resp.Body)
	return resp.StatusCode, respBody, err
}

// GRPC is an OTLP/gRPC client of one collector.
type GRPC struct {
	conn *grpc.ClientConn
}

// DialGRPC returns an OTLP/gRPC client of the receiver at addr (plain text).
func DialGRPC(addr string) (*GRPC, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &GRPC{conn: conn}, nil
}

// ExportTraces sends td through the TraceService.
func (g *GRPC) ExportTraces(ctx context.Context, td ptrace.Traces) (ptraceotlp.ExportResponse, error) {
	return ptraceotlp.NewGRPCClient(g.conn).Export(ctx, ptraceotlp.NewExportRequestFromTraces(td))
}

// ExportLogs sends ld through the LogsService.
func (g *GRPC) ExportLogs(ctx context.Context, ld plog.Logs) (plogotlp.ExportResponse, error) {
	return plogotlp.NewGRPCClient(g.conn).Export(ctx, plogotlp.NewExportRequestFromLogs(ld))
}

// Close closes the connection.
func (g *GRPC) Close() error { return g.conn.Close() }

// Get fetches url and returns the status code and body.
func Get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Sample is one series of the collector's metrics.
type Sample = series.Sample

// ParseExposition parses the Prometheus text format.
func ParseExposition(text string) ([]Sample, error) { return series.Parse(text) }

// Sum adds the values of the samples named name (or name_total) whose labels
// include every pair of want.
func Sum(samples []Sample, name string, want map[string]string) (float64, bool) {
	return series.Sum(samples, name, want)
}

// Names returns the distinct sample names with the given prefix, for
// failure messages.
func Names(samples []Sample, prefix string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range samples {
		if strings.HasPrefix(s.Name, prefix) && !seen[s.Name] {
			seen[s.Name] = true
			out = append(out, s.Name)
		}
	}
	return out
}

// Describe formats samples for a failure message.
func Describe(samples []Sample, prefix string) string {
	var b strings.Builder
	for _, s := range samples {
		if strings.HasPrefix(s.Name, prefix) {
			fmt.Fprintf(&b, "%s%v %g\n", s.Name, s.Labels, s.Value)
		}
	}
	return b.String()
}
