// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

// Benchmarks of the request path's cost through the extension:
//
//	go test -run='^$' -bench=E2E -benchmem ./extension/throttleextension/

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/extension/extensionmiddleware"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/otelthrottle/throttle/internal/decision"
)

// e2eNopWriter is a ResponseWriter that keeps nothing, so that the
// benchmark measures the handlers and not a recorder.
type e2eNopWriter struct{ h http.Header }

func (w *e2eNopWriter) Header() http.Header             { return w.h }
func (*e2eNopWriter) Write(p []byte) (int, error)       { return len(p), nil }
func (*e2eNopWriter) WriteHeader(int)                   {}
func (*e2eNopWriter) Flush()                            {}
func (*e2eNopWriter) Unwrap() http.ResponseWriter       { return nil }
func (*e2eNopWriter) ReadFrom(io.Reader) (int64, error) { return 0, nil }

// BenchmarkE2EAdmitOverhead is the admit path in Normal: the receiver's
// handler bare, and wrapped by the extension's GetHTTPHandler (classify,
// decide, count the decision). The request has no body, so the budget,
// which charges a body as it is read, is not involved: BenchmarkHTTPAdmitBody
// in internal/middleware measures that path.
// The difference between "bare" and "throttled" is the throttle's cost per
// admitted request (target: under 100ns, no allocation added). "sdk_meter"
// counts the decision through an OpenTelemetry SDK meter provider, as a
// collector does; "nop_meter" through a no-op one.
func BenchmarkE2EAdmitOverhead(b *testing.B) {
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	newReq := func() *http.Request {
		req, err := http.NewRequest(http.MethodPost, "http://collector:4318/v1/traces", http.NoBody)
		require.NoError(b, err)
		req.ContentLength = 64 << 10
		req.Header.Set("Content-Type", pbType)
		return req
	}
	run := func(b *testing.B, h http.Handler) {
		req := newReq()
		w := &e2eNopWriter{h: http.Header{}}
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, req)
		}
	}

	b.Run("bare", func(b *testing.B) { run(b, bare) })
	for _, tc := range []struct {
		name string
		nop  bool
	}{{"throttled/sdk_meter", false}, {"throttled/nop_meter", true}} {
		b.Run(tc.name, func(b *testing.B) {
			env := startE2EThrottle(b, e2eOptions{nopTelemetry: tc.nop})
			env.setLevel(b, e2eCalm, decision.StateNormal)
			wrap, err := env.ext.(extensionmiddleware.HTTPServer).GetHTTPHandler(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			h, err := wrap(context.Background(), bare)
			require.NoError(b, err)
			run(b, h)
			b.StopTimer()
			require.EqualValues(b, 0, env.requests(b, "http", decision.SignalTraces, "denied", "budget"))
		})
	}
}

// e2eBody512KiB is an OTLP/HTTP protobuf trace export of about 512 KiB made
// of small spans with a few attributes, like an SDK batch: decoding it is
// the work the early rejection saves.
func e2eBody512KiB(tb testing.TB) []byte {
	tb.Helper()
	const target = 512 << 10
	build := func(n int) []byte {
		td := ptrace.NewTraces()
		spans := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
		for i := range n {
			sp := spans.AppendEmpty()
			sp.SetName("GET /api/v1/orders")
			sp.SetTraceID([16]byte{1, byte(i >> 16), byte(i >> 8), byte(i)})
			sp.SetSpanID([8]byte{2, byte(i >> 16), byte(i >> 8), byte(i)})
			sp.Attributes().PutStr("http.method", "GET")
			sp.Attributes().PutInt("http.status_code", 200)
			sp.Attributes().PutStr("net.peer.name", "orders.internal")
		}
		body, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		require.NoError(tb, err)
		return body
	}
	per := float64(len(build(1000))) / 1000
	return build(int(target / per))
}

// BenchmarkE2EReject512KiB sends the same ~512 KiB protobuf body over
// loopback to the real otlpreceiver, from the same client at a fixed
// concurrency (4 x GOMAXPROCS goroutines): in Normal every request is read,
// decompressed (no-op), decoded and consumed (by a no-op consumer); in Open
// every request is answered 429 before its body is read. req/s of
// reject_open over req/s of admit_normal is how much work the early
// rejection saves. The client does not know either: it still writes the
// body until the server answers and closes the connection. (No SetBytes: a
// rejected body is mostly not transferred, so MB/s would mislead.)
func BenchmarkE2EReject512KiB(b *testing.B) {
	body := e2eBody512KiB(b)
	for _, tc := range []struct {
		name   string
		level  float64
		state  decision.State
		status int
	}{
		{"admit_normal", e2eCalm, decision.StateNormal, http.StatusOK},
		{"reject_open", e2eOpen, decision.StateOpen, http.StatusTooManyRequests},
	} {
		b.Run(tc.name, func(b *testing.B) {
			env := startE2E(b, e2eOptions{nopConsumers: true, nopTelemetry: true})
			env.setLevel(b, tc.level, tc.state)
			c := e2eHTTPClient(b)
			url := "http://" + env.httpAddr + "/v1/traces"
			var unexpected, transportErrs atomic.Int64
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					req.Header.Set("Content-Type", pbType)
					resp, err := c.Do(req)
					if err != nil {
						transportErrs.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != tc.status {
						unexpected.Add(1)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64(transportErrs.Load())/float64(b.N), "errors/op")
			if n := unexpected.Load(); n > 0 {
				b.Errorf("%d responses were not %d", n, tc.status)
			}
		})
	}
}
