// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
)

// Payload is one request body, encoded once and sent many times: the
// generator must not spend its CPU marshalling, or it becomes the bottleneck
// it is supposed to find in the collector.
type Payload struct {
	Signal Signal
	// Items is the number of spans, data points or log records in the body.
	Items int
	// Body is what goes on the wire: protobuf or JSON, gzipped when Gzip.
	Body []byte
	// Proto is the uncompressed protobuf encoding (the gRPC message; gRPC
	// compresses per message itself).
	Proto []byte
	// RawSize is the size of the uncompressed body.
	RawSize int
}

// payloadKey identifies a body: bodies are built once per key.
type payloadKey struct {
	signal   Signal
	items    int
	attrSize int
}

// randomText returns n printable bytes from a fixed seed: not all zeros,
// which gzip would shrink to nothing, and the same on every run. Callers
// take a distinct slice per item, or gzip would find every item's attribute
// in the previous one and compress 30 times.
func randomText(n int, seed uint64) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	r := rand.New(rand.NewPCG(seed, 0x7468726f74746c65))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// BuildPayload encodes a request of the signal with items items, each
// carrying one string attribute of attrSize bytes (the bulk of the size) and
// a few small ones, as a real instrumentation library would.
func BuildPayload(s Signal, items, attrSize int, encoding Encoding, gz bool) (*Payload, error) {
	return buildPayload(s, items, attrSize, encoding, gz, nil)
}

// buildPayload is BuildPayload with resource attributes added to the
// items' resource.
func buildPayload(s Signal, items, attrSize int, encoding Encoding, gz bool, resource map[string]string) (*Payload, error) {
	if items < 1 {
		return nil, fmt.Errorf("items per request must be >= 1, got %d", items)
	}
	var protoBody, jsonBody []byte
	var err error
	switch s {
	case Traces:
		td := buildTraces(items, attrSize)
		addResource(td.ResourceSpans().At(0).Resource(), resource)
		req := ptraceotlp.NewExportRequestFromTraces(td)
		if protoBody, err = req.MarshalProto(); err == nil && encoding == JSON {
			jsonBody, err = req.MarshalJSON()
		}
	case Metrics:
		md := buildMetrics(items, attrSize)
		addResource(md.ResourceMetrics().At(0).Resource(), resource)
		req := pmetricotlp.NewExportRequestFromMetrics(md)
		if protoBody, err = req.MarshalProto(); err == nil && encoding == JSON {
			jsonBody, err = req.MarshalJSON()
		}
	case Logs:
		ld := buildLogs(items, attrSize)
		addResource(ld.ResourceLogs().At(0).Resource(), resource)
		req := plogotlp.NewExportRequestFromLogs(ld)
		if protoBody, err = req.MarshalProto(); err == nil && encoding == JSON {
			jsonBody, err = req.MarshalJSON()
		}
	default:
		return nil, fmt.Errorf("unknown signal %d", s)
	}
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", s, err)
	}
	body := protoBody
	if encoding == JSON {
		body = jsonBody
	}
	p := &Payload{Signal: s, Items: items, Proto: protoBody, RawSize: len(body), Body: body}
	if gz {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		if _, err := w.Write(body); err != nil {
			return nil, err
		}
		if err := w.Close(); err != nil {
			return nil, err
		}
		p.Body = buf.Bytes()
	}
	return p, nil
}

// addResource puts attrs into res.
func addResource(res pcommon.Resource, attrs map[string]string) {
	for k, v := range attrs {
		res.Attributes().PutStr(k, v)
	}
}

func buildTraces(n, attrSize int) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", "throttle-loadgen")
	rs.Resource().Attributes().PutStr("host.name", "loadgen")
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("github.com/otelthrottle/throttle/testbed/internal/loadgen")
	now := time.Now()
	text := randomText(n*attrSize, 1)
	for i := range n {
		sp := ss.Spans().AppendEmpty()
		sp.SetName("GET /api/items/" + strconv.Itoa(i%64))
		sp.SetKind(ptrace.SpanKindServer)
		sp.SetTraceID(pcommon.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)})
		sp.SetSpanID(pcommon.SpanID{1, 2, 3, 4, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)})
		sp.SetStartTimestamp(pcommon.NewTimestampFromTime(now.Add(-time.Duration(i+1) * time.Millisecond)))
		sp.SetEndTimestamp(pcommon.NewTimestampFromTime(now))
		a := sp.Attributes()
		a.PutStr("http.request.method", "GET")
		a.PutInt("http.response.status_code", 200)
		a.PutStr("loadgen.payload", text[i*attrSize:(i+1)*attrSize])
	}
	return td
}

func buildMetrics(n, attrSize int) pmetric.Metrics {
	md := pmetric.NewMetrics()
	rm := md.ResourceMetrics().AppendEmpty()
	rm.Resource().Attributes().PutStr("service.name", "throttle-loadgen")
	sm := rm.ScopeMetrics().AppendEmpty()
	sm.Scope().SetName("github.com/otelthrottle/throttle/testbed/internal/loadgen")
	m := sm.Metrics().AppendEmpty()
	m.SetName("loadgen.requests")
	sum := m.SetEmptySum()
	sum.SetIsMonotonic(true)
	sum.SetAggregationTemporality(pmetric.AggregationTemporalityCumulative)
	now := pcommon.NewTimestampFromTime(time.Now())
	text := randomText(n*attrSize, 2)
	for i := range n {
		dp := sum.DataPoints().AppendEmpty()
		dp.SetIntValue(int64(i))
		dp.SetTimestamp(now)
		dp.Attributes().PutInt("loadgen.series", int64(i))
		dp.Attributes().PutStr("loadgen.payload", text[i*attrSize:(i+1)*attrSize])
	}
	return md
}

func buildLogs(n, attrSize int) plog.Logs {
	ld := plog.NewLogs()
	rl := ld.ResourceLogs().AppendEmpty()
	rl.Resource().Attributes().PutStr("service.name", "throttle-loadgen")
	sl := rl.ScopeLogs().AppendEmpty()
	sl.Scope().SetName("github.com/otelthrottle/throttle/testbed/internal/loadgen")
	now := pcommon.NewTimestampFromTime(time.Now())
	text := randomText(n*attrSize, 3)
	for i := range n {
		r := sl.LogRecords().AppendEmpty()
		r.SetTimestamp(now)
		r.SetSeverityNumber(plog.SeverityNumberInfo)
		r.Body().SetStr("request " + strconv.Itoa(i) + " handled")
		r.Attributes().PutStr("loadgen.payload", text[i*attrSize:(i+1)*attrSize])
	}
	return ld
}
