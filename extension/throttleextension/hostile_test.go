// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

// Hostile and odd requests against the real otlpreceiver with middlewares:
// [{id: throttle}] on both servers, the state driven through the fake
// resource source (helpers in e2e_helpers_test.go). Each test proves, over
// the wire, that classification stays right, that nothing gets past the
// throttle by a trick, that a rejected client gets its 429 /
// RESOURCE_EXHAUSTED, and that its body is not read.
//
// HTTP requests are written as raw bytes on a TCP connection: net/http
// clients clean paths, refuse odd request lines and add headers of their
// own. Where a rejection must not read the body, the request is sent head
// only with "Expect: 100-continue" and a Content-Length the client never
// honours: the server can only answer without the body, and a server that
// wanted it would answer "100 Continue" instead of 429. gRPC requests that
// grpc-go cannot send (wrong content-type, odd :path) are written as raw
// HTTP/2 frames. Every connection has a deadline; every wait is bounded.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/middleware"
)

// The small admission budget of the budget tests: four unknown-size
// reservations fill it.
const (
	hostileBudget  = 64 << 10
	hostileUnknown = 16 << 10
)

// hostileBudgetConf is the throttle configuration of the budget tests: no
// per-key share (every client of these tests is 127.0.0.1), no exempt
// signal (which would keep a quarter of the budget for itself), and an
// idle timeout longer than any of these tests, which turn it down where
// they are about it.
func hostileBudgetConf() map[string]any {
	return map[string]any{
		"admission": map[string]any{
			"max_inflight_bytes": hostileBudget, "unknown_size": hostileUnknown, "idle_timeout": "1m",
			"fairness": map[string]any{"share": 1},
		},
	}
}

// hostileTracesMethod is the gRPC full method of the OTLP traces service.
const hostileTracesMethod = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

// hostileResp is one response read from a raw connection.
type hostileResp struct {
	*http.Response
	body []byte
	// closed: the server closed the connection after the response (only
	// looked at when asked for).
	closed bool
}

func (r hostileResp) e2e() e2eResponse { return e2eResponse{Response: r.Response, body: r.body} }

// hostileHead builds a request head: the request line "method target proto",
// the header lines as given (no Host is added) and the blank line.
func hostileHead(method, target, proto string, headers ...string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s %s\r\n", method, target, proto)
	for _, h := range headers {
		b.WriteString(h)
		b.WriteString("\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// hostileRaw writes raw on a new connection to addr and reads one response.
// The write runs in its own goroutine (it may block once the server stops
// reading, and ends when the connection is closed). With checkClose it then
// waits, within the deadline, for the server to close the connection.
func hostileRaw(t *testing.T, addr string, raw []byte, checkClose bool) hostileResp {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, e2eWait)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(e2eWait)))
	writeDone := make(chan struct{})
	go func() {
		defer close(writeDone)
		_, _ = conn.Write(raw)
	}()
	defer func() {
		_ = conn.Close()
		<-writeDone
	}()
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	r := hostileResp{Response: resp, body: body}
	if checkClose {
		_, err := br.ReadByte()
		r.closed = errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
	}
	return r
}

// hostileChunked encodes body in the chunked transfer coding.
func hostileChunked(body []byte, chunk int) []byte {
	var b bytes.Buffer
	for len(body) > 0 {
		n := min(chunk, len(body))
		fmt.Fprintf(&b, "%x\r\n", n)
		b.Write(body[:n])
		b.WriteString("\r\n")
		body = body[n:]
	}
	b.WriteString("0\r\n\r\n")
	return b.Bytes()
}

// hostileTraces returns a protobuf traces export request of at least size
// bytes and its span count.
func hostileTraces(t *testing.T, size int) ([]byte, int) {
	t.Helper()
	for n := max(1, size/64); ; n += max(1, n/8) {
		b, err := e2eSignals[0].proto(n)
		require.NoError(t, err)
		if len(b) >= size {
			return b, n
		}
	}
}

func hostileGzip(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, err := w.Write(b)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

func hostileZlib(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	_, err := w.Write(b)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

func hostileZstd(t *testing.T, b []byte) []byte {
	t.Helper()
	w, err := zstd.NewWriter(nil)
	require.NoError(t, err)
	defer w.Close()
	return w.EncodeAll(b, nil)
}

func hostileLZ4(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := lz4.NewWriter(&buf)
	_, err := w.Write(b)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// hostileReserved reads budget=reserved from the inflight_bytes gauge; -1
// if it cannot be read (safe inside require.Eventually).
func hostileReserved(env *e2eEnv) int64 {
	m, err := env.tel.GetMetric("otelcol_throttle_inflight_bytes")
	if err != nil {
		return -1
	}
	g, ok := m.Data.(metricdata.Gauge[int64])
	if !ok {
		return -1
	}
	for _, dp := range g.DataPoints {
		if e2edata.AttrIs(dp.Attributes, "budget", "reserved") {
			return dp.Value
		}
	}
	return -1
}

// peakMark is the largest amount the admission budget has held since the
// extension started.
type peakMark struct{ e *throttleExtension }

func (p peakMark) Load() int64 { return p.e.runner.MiddlewareConfig().Admission.Stats().Peak }

// hostileHighWater is the mark of the largest amount the admission budget
// holds; every test starts its own extension.
func hostileHighWater(t *testing.T, env *e2eEnv) peakMark {
	t.Helper()
	e, ok := env.ext.(*throttleExtension)
	require.True(t, ok)
	return peakMark{e}
}

// requireBudgetCutOff checks the answer otlpreceiver gives when the body
// read fails with the throttle's budget error: 429, Retry-After 1 (the
// budget delay), and the throttle's Status, RetryInfo included, in the
// request's encoding.
func requireBudgetCutOff(t *testing.T, r hostileResp, contentType string) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, r.StatusCode, "body: %q", r.body)
	assert.Equal(t, "1", r.Header.Get("Retry-After"))
	assert.Equal(t, contentType, r.Header.Get("Content-Type"))
	st := &spb.Status{}
	if contentType == pbType {
		require.NoError(t, proto.Unmarshal(r.body, st))
	} else {
		require.NoError(t, protojson.Unmarshal(r.body, st))
	}
	assert.EqualValues(t, codes.ResourceExhausted, st.GetCode())
	assert.Equal(t, "throttle: collector overloaded (budget)", st.GetMessage())
	var info *errdetails.RetryInfo
	for _, d := range status.FromProto(st).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	require.NotNil(t, info, "no RetryInfo in %v", st)
	assert.Equal(t, time.Second, info.GetRetryDelay().AsDuration())
}

// TestHostilePaths sends path tricks as raw request lines, first in Normal
// (with the body, to learn what otlpreceiver's ServeMux does with each:
// serve, 307 to the clean path, 404 or 400), then in Shedding with
// drop_min = drop_max = 1 (every classified request is shed, with the
// connection kept), then in Open (head only, Expect: 100-continue, body
// never sent). A path the receiver serves with
// the traces handler is rejected in Open; a path the receiver would only
// redirect or refuse may also be rejected (the classifier cleans and
// decodes: the error is on the safe side); a path the classifier does not
// know gets the receiver's own answer in both states. The counters match
// exactly: every classified path is one decision, nothing else is counted.
func TestHostilePaths(t *testing.T) {
	env := startE2E(t, e2eOptions{conf: map[string]any{
		"rules": map[string]any{"default": map[string]any{"drop_min": 1.0, "drop_max": 1.0}},
	}})
	body, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	long := 64 << 10

	cases := []struct {
		name, target string
		// normal is otlpreceiver's answer in Normal: 200 means the span was
		// delivered to the traces pipeline.
		normal int
		// classified: the throttle decides it (429 in Open).
		classified bool
	}{
		{"plain", "/v1/traces", 200, true},
		{"query", "/v1/traces?x=1&y=/v1/logs", 200, true},
		{"percent-encoded letter", "/v1/%74races", 200, true},
		{"fully percent-encoded", "/%76%31/%74%72%61%63%65%73", 200, true},
		{"absolute-form", "http://" + env.httpAddr + "/v1/traces", 200, true},
		{"absolute-form other host", "http://other.example:1/v1/traces", 200, true},
		{"double leading slash", "//v1/traces", 307, true},
		{"inner double slash", "/v1//traces", 307, true},
		{"dot segment", "/v1/./traces", 307, true},
		{"dot-dot segment", "/v1/x/../traces", 307, true},
		{"leading dot", "/./v1/traces", 307, true},
		{"dot-dot above root", "/../v1/traces", 307, true},
		{"absolute-form unclean", "http://other.example//v1/./traces", 307, true},
		{"trailing slash", "/v1/traces/", 404, true},
		{"encoded slash", "/v1%2Ftraces", 404, true},
		{"encoded trailing slash", "/v1/traces%2F", 404, true},
		{"upper case", "/V1/TRACES", 404, false},
		{"mixed case", "/v1/Traces", 404, false},
		{"fragment", "/v1/traces#x", 404, false},
		{"semicolon", "/v1/traces;x", 404, false},
		{"sibling", "/v1/tracesx", 404, false},
		{"asterisk", "*", 400, false},
		{"relative", "v1/traces", 400, false},
		{"64KiB of slashes", "/" + strings.Repeat("/", long) + "v1/traces", 307, true},
		{"64KiB of dot-dots", "/v1/" + strings.Repeat("x/../", long/5) + "traces", 307, true},
		{"64KiB query", "/v1/traces?q=" + strings.Repeat("a", long), 200, true},
		{"64KiB clean unknown", "/v1/" + strings.Repeat("a", long), 404, false},
		{"64KiB under traces", "/v1/traces/" + strings.Repeat("a", long), 404, false},
	}

	classified := 0
	for _, tc := range cases {
		if tc.classified {
			classified++
		}
	}

	t.Run("normal", func(t *testing.T) {
		for _, tc := range cases {
			before := env.traces.SpanCount()
			raw := append(hostileHead(http.MethodPost, tc.target, "HTTP/1.1",
				"Host: x", "Content-Type: "+pbType, "Content-Length: "+strconv.Itoa(len(body))), body...)
			r := hostileRaw(t, env.httpAddr, raw, false)
			assert.Equal(t, tc.normal, r.StatusCode, "%s: %q", tc.name, r.body)
			delivered := env.traces.SpanCount() - before
			if tc.normal == http.StatusOK {
				assert.Equal(t, 1, delivered, tc.name)
			} else {
				assert.Zero(t, delivered, tc.name)
			}
			if tc.normal == http.StatusTemporaryRedirect {
				// A client that follows the redirect lands on the
				// throttled path with its method and body.
				assert.Equal(t, "/v1/traces", r.Header.Get("Location"), tc.name)
			}
		}
		assert.EqualValues(t, classified, env.requests(t, "http", decision.SignalTraces, "allowed", ""))
		assert.Zero(t, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
	})

	t.Run("shedding", func(t *testing.T) {
		env.setLevel(t, e2eShedding, decision.StateShedding)
		before := env.traces.SpanCount()
		for _, tc := range cases {
			raw := append(hostileHead(http.MethodPost, tc.target, "HTTP/1.1",
				"Host: x", "Content-Type: "+pbType, "Content-Length: "+strconv.Itoa(len(body))), body...)
			r := hostileRaw(t, env.httpAddr, raw, false)
			if tc.classified {
				requireHTTPRejection(t, r.e2e(), pbType, false)
				continue
			}
			assert.Equal(t, tc.normal, r.StatusCode, "%s: %q", tc.name, r.body)
		}
		assert.Equal(t, before, env.traces.SpanCount(), "nothing reached the sink in Shedding")
		assert.EqualValues(t, classified, env.requests(t, "http", decision.SignalTraces, "denied", "shed"))
	})

	t.Run("open", func(t *testing.T) {
		env.setLevel(t, e2eOpen, decision.StateOpen)
		before := env.traces.SpanCount()
		for _, tc := range cases {
			raw := hostileHead(http.MethodPost, tc.target, "HTTP/1.1",
				"Host: x", "Content-Type: "+pbType, "Content-Length: 1048576", "Expect: 100-continue")
			r := hostileRaw(t, env.httpAddr, raw, false)
			if tc.classified {
				requireHTTPRejection(t, r.e2e(), pbType, true)
				continue
			}
			// The receiver's own answer, the same as in Normal; the body
			// was not asked for either.
			assert.Equal(t, tc.normal, r.StatusCode, "%s: %q", tc.name, r.body)
			assert.Empty(t, r.Header.Get("Retry-After"), tc.name)
		}
		assert.Equal(t, before, env.traces.SpanCount(), "nothing reached the sink in Open")
		assert.EqualValues(t, classified, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
		assert.EqualValues(t, classified, env.requests(t, "http", decision.SignalTraces, "allowed", ""), "no new admission")
	})
}

// TestHostileContentTypes: in Open the Content-Type never changes the
// verdict, only the encoding of the Status body (protobuf for the
// application/x-protobuf media type in any case and with parameters, JSON
// for everything else, as otlpreceiver's own error handler does), and the
// body is never asked for. Normal shows what the receiver itself does with
// each type: the throttle does not change it.
func TestHostileContentTypes(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	pb, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	js, err := e2eSignals[0].json(1)
	require.NoError(t, err)

	cases := []struct {
		name, header string // header "" sends no Content-Type at all
		json         bool   // the body sent in Normal is JSON
		normal       int    // the receiver's answer in Normal
		reject       string // the Content-Type of the 429
	}{
		{"missing", "", false, http.StatusUnsupportedMediaType, jsonType},
		{"text/plain", "text/plain", false, http.StatusUnsupportedMediaType, jsonType},
		{"protobuf with charset", "application/x-protobuf; charset=utf-8", false, http.StatusOK, pbType},
		{"protobuf upper case", "APPLICATION/X-PROTOBUF", false, http.StatusOK, pbType},
		{"JSON upper case", "APPLICATION/JSON", true, http.StatusOK, jsonType},
		{"JSON with charset", "application/json; charset=utf-8", true, http.StatusOK, jsonType},
		{"malformed protobuf", "application/x-protobuf;;", false, http.StatusUnsupportedMediaType, jsonType},
		{"multipart", "multipart/form-data; boundary=x", false, http.StatusUnsupportedMediaType, jsonType},
		{"grpc", "application/grpc", false, http.StatusUnsupportedMediaType, jsonType},
	}
	headers := func(ct string, extra ...string) []string {
		h := []string{"Host: x"}
		if ct != "" {
			h = append(h, "Content-Type: "+ct)
		}
		return append(h, extra...)
	}

	t.Run("normal", func(t *testing.T) {
		for _, tc := range cases {
			body := pb
			if tc.json {
				body = js
			}
			before := env.traces.SpanCount()
			raw := append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1",
				headers(tc.header, "Content-Length: "+strconv.Itoa(len(body)))...), body...)
			r := hostileRaw(t, env.httpAddr, raw, false)
			assert.Equal(t, tc.normal, r.StatusCode, "%s: %q", tc.name, r.body)
			if tc.normal == http.StatusOK {
				assert.Equal(t, before+1, env.traces.SpanCount(), tc.name)
			}
		}
	})

	t.Run("open", func(t *testing.T) {
		env.setLevel(t, e2eOpen, decision.StateOpen)
		before := env.traces.SpanCount()
		for _, tc := range cases {
			raw := hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1",
				headers(tc.header, "Content-Length: 4194304", "Expect: 100-continue")...)
			r := hostileRaw(t, env.httpAddr, raw, false)
			requireHTTPRejection(t, r.e2e(), tc.reject, true)
		}
		// A GET on an OTLP path is decided like a POST (the receiver would
		// answer 405): the path alone classifies.
		r := hostileRaw(t, env.httpAddr, hostileHead(http.MethodGet, "/v1/traces", "HTTP/1.1", "Host: x"), false)
		requireHTTPRejection(t, r.e2e(), jsonType, true)
		assert.Equal(t, before, env.traces.SpanCount())
		assert.EqualValues(t, len(cases)+1, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
	})
}

// TestHostileHugeHeaders: the otlpreceiver's server keeps net/http's
// default MaxHeaderBytes (1 MiB; confighttp sets none). 500 KiB of headers
// fit: such a request reaches the throttle, which rejects it in Open (and
// admits it in Normal). 2 MiB of headers are answered 431 by net/http
// before any handler runs: not counted, nothing at the sink, in both
// states, and the server keeps serving.
func TestHostileHugeHeaders(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	body, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	pad := func(total, each int) []string {
		var h []string
		for i := 0; total > 0; i++ {
			n := min(each, total)
			h = append(h, fmt.Sprintf("X-Pad-%d: %s", i, strings.Repeat("p", n)))
			total -= n
		}
		return h
	}
	request := func(padding []string, expect bool) []byte {
		h := append([]string{"Host: x", "Content-Type: " + pbType, "Content-Length: " + strconv.Itoa(len(body))}, padding...)
		if expect {
			return hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", append(h, "Expect: 100-continue")...)
		}
		return append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", h...), body...)
	}
	fits := [][]string{pad(500<<10, 10<<10), pad(500<<10, 500<<10), pad(200<<10, 8)}
	tooBig := [][]string{pad(2<<20, 10<<10), pad(2<<20, 2<<20)}

	for _, p := range fits {
		r := hostileRaw(t, env.httpAddr, request(p, false), false)
		require.Equal(t, http.StatusOK, r.StatusCode, "%q", r.body)
	}
	assert.Equal(t, len(fits), env.traces.SpanCount())
	assert.EqualValues(t, len(fits), env.requests(t, "http", decision.SignalTraces, "allowed", ""))
	for _, p := range tooBig {
		r := hostileRaw(t, env.httpAddr, request(p, false), false)
		assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, r.StatusCode)
	}

	env.setLevel(t, e2eOpen, decision.StateOpen)
	for _, p := range fits {
		requireHTTPRejection(t, hostileRaw(t, env.httpAddr, request(p, true), false).e2e(), pbType, true)
	}
	for _, p := range tooBig {
		r := hostileRaw(t, env.httpAddr, request(p, true), false)
		assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, r.StatusCode)
	}
	assert.Equal(t, len(fits), env.traces.SpanCount(), "nothing more reached the sink")
	assert.EqualValues(t, len(fits), env.requests(t, "http", decision.SignalTraces, "denied", "open"))
	assert.EqualValues(t, len(fits), env.requests(t, "http", decision.SignalTraces, "allowed", ""))

	// Still serving.
	requireHTTPRejection(t, hostileRaw(t, env.httpAddr, request(nil, true), false).e2e(), pbType, true)
}

// TestHostileHTTPVersions: HTTP/1.0 clients are rejected in Open with the
// same 429 and the connection is closed (also when they ask for
// keep-alive); pipelined HTTP/1.1 requests behind a rejected one are never
// served; an "Upgrade: h2c" request is served as HTTP/1.1 (no 101) and so
// decided like any other; a request line claiming HTTP/2.0 is refused by
// net/http (505) before any handler.
func TestHostileHTTPVersions(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	body, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	cl := "Content-Length: " + strconv.Itoa(len(body))
	ct := "Content-Type: " + pbType
	http10 := append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.0", ct, cl), body...)
	http10KeepAlive := append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.0", ct, cl, "Connection: keep-alive"), body...)
	upgrade := append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", "Host: x", ct, cl,
		"Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"), body...)
	http20 := append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/2.0", "Host: x", ct, cl), body...)

	// Normal: HTTP/1.0 is served and closed; the upgrade is ignored.
	r := hostileRaw(t, env.httpAddr, http10, true)
	assert.Equal(t, http.StatusOK, r.StatusCode)
	assert.True(t, r.closed, "HTTP/1.0 without keep-alive is closed")
	r = hostileRaw(t, env.httpAddr, upgrade, false)
	assert.Equal(t, http.StatusOK, r.StatusCode)
	assert.Equal(t, "HTTP/1.1", r.Proto)
	r = hostileRaw(t, env.httpAddr, http20, false)
	assert.Equal(t, http.StatusHTTPVersionNotSupported, r.StatusCode)
	assert.Equal(t, 2, env.traces.SpanCount())
	assert.EqualValues(t, 2, env.requests(t, "http", decision.SignalTraces, "allowed", ""))

	env.setLevel(t, e2eOpen, decision.StateOpen)
	for _, raw := range [][]byte{http10, http10KeepAlive} {
		r := hostileRaw(t, env.httpAddr, raw, true)
		requireHTTPRejection(t, r.e2e(), pbType, true)
		assert.True(t, r.closed, "the connection is closed after the 429")
	}
	r = hostileRaw(t, env.httpAddr, upgrade, false)
	requireHTTPRejection(t, r.e2e(), pbType, true)
	assert.Equal(t, "HTTP/1.1", r.Proto)
	r = hostileRaw(t, env.httpAddr, http20, false)
	assert.Equal(t, http.StatusHTTPVersionNotSupported, r.StatusCode)

	// Two pipelined requests: the first is rejected with Connection: close
	// and the second is never read.
	one := append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", "Host: x", ct, cl), body...)
	r = hostileRaw(t, env.httpAddr, append(append([]byte{}, one...), one...), true)
	requireHTTPRejection(t, r.e2e(), pbType, true)
	assert.True(t, r.closed, "the pipelined request was answered")

	assert.Equal(t, 2, env.traces.SpanCount(), "nothing reached the sink in Open")
	assert.EqualValues(t, 4, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
	assert.EqualValues(t, 2, env.requests(t, "http", decision.SignalTraces, "allowed", ""))
}

// TestHostileH2CNotServed: otlpreceiver's HTTP server is built by confighttp
// without http.Server.Protocols, so it serves HTTP/1 (and HTTP/2 only over
// TLS): cleartext HTTP/2 with prior knowledge is not spoken. net/http hands
// the "PRI * HTTP/2.0" preface to the handler chain as a request for "*",
// which the throttle does not classify and ServeMux answers 400; an h2c
// client fails. Nothing is delivered, decided or bypassed, in Normal and in
// Open.
func TestHostileH2CNotServed(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	body, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr, Timeout: e2eWait}

	for _, level := range []struct {
		l float64
		s decision.State
	}{{e2eCalm, decision.StateNormal}, {e2eOpen, decision.StateOpen}} {
		env.setLevel(t, level.l, level.s)
		req, err := http.NewRequest(http.MethodPost, "http://"+env.httpAddr+"/v1/traces", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", pbType)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		require.Error(t, err, "%v: an h2c client was served (%v)", level.s, resp)
		t.Logf("%v: h2c client: %v", level.s, err)

		r := hostileRaw(t, env.httpAddr, []byte(http2.ClientPreface), false)
		assert.Equal(t, http.StatusBadRequest, r.StatusCode)
		assert.Equal(t, "HTTP/1.1", r.Proto)
	}
	assert.Zero(t, env.traces.SpanCount())
	assert.Zero(t, env.requests(t, "http", decision.SignalTraces, "allowed", ""))
	assert.Zero(t, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
}

// hostileHold opens an HTTP traces request that sends its head and the
// first byte of its body, then nothing: it holds its first reservation,
// unknown_size, for as long as it is open, so that another HTTP request is
// not alone in the budget. The returned func closes it and waits for the
// budget to be empty again.
func hostileHold(t *testing.T, env *e2eEnv) func() {
	t.Helper()
	_, stop := hostileSlowBody(t, env.httpAddr, hostileBudget, 1, 0)
	require.Eventually(t, func() bool { return hostileReserved(env) == hostileUnknown }, e2eWait, time.Millisecond,
		"the paused body does not hold its first reservation")
	return func() {
		t.Helper()
		stop()
		require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond,
			"the held reservation was not released")
	}
}

// TestHostileChunkedBudget: in Normal, against a 64 KiB admission budget
// with unknown_size 16 KiB, a body of unknown size (chunked, or compressed:
// confighttp drops Content-Length when it decompresses) is charged the
// decompressed bytes it actually reads. One that fits is delivered; one
// that does not, while another request holds part of the budget, is cut off
// when the budget cannot grow: otlpreceiver answers the read error 429 +
// Retry-After with the throttle's Status (RetryInfo included), nothing
// reaches the sink and the reservation is returned. Such a request counts
// as allowed: it was admitted when its first byte was reserved, and the 429
// comes from the receiver. A body larger than the whole budget with nothing
// else reserved holds the whole budget, reads the rest in the oversize lane
// and is delivered (a retryable 429 could never succeed and the client
// would end up dropping the data); the budget itself is never exceeded.
func TestHostileChunkedBudget(t *testing.T) {
	fits, fitsSpans := hostileTraces(t, 40<<10)
	tooBig, tooBigSpans := hostileTraces(t, 200<<10)
	send := func(t *testing.T, env *e2eEnv, contentType string, extra []string, body []byte) hostileResp {
		h := append([]string{"Host: x", "Content-Type: " + contentType}, extra...)
		return hostileRaw(t, env.httpAddr, append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", h...), body...), false)
	}
	chunked := []string{"Transfer-Encoding: chunked"}
	released := func(t *testing.T, env *e2eEnv, hw peakMark) {
		t.Helper()
		require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond, "reservation not released")
		assert.LessOrEqual(t, hw.Load(), int64(hostileBudget))
	}

	t.Run("chunked fits", func(t *testing.T) {
		env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
		hw := hostileHighWater(t, env)
		r := send(t, env, pbType, chunked, hostileChunked(fits, 4<<10))
		require.Equal(t, http.StatusOK, r.StatusCode, "%q", r.body)
		assert.Equal(t, fitsSpans, env.traces.SpanCount())
		// Grown beyond unknown_size to cover every byte read.
		assert.GreaterOrEqual(t, hw.Load(), int64(len(fits)))
		released(t, env, hw)
	})

	for _, ct := range []string{pbType, jsonType} {
		t.Run("chunked too big "+ct, func(t *testing.T) {
			env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
			hw := hostileHighWater(t, env)
			unhold := hostileHold(t, env)
			r := send(t, env, ct, chunked, hostileChunked(tooBig, 4<<10))
			requireBudgetCutOff(t, r, ct)
			assert.Zero(t, env.traces.SpanCount())
			assert.EqualValues(t, 2, env.requests(t, "http", decision.SignalTraces, "allowed", ""), "the held body and this one")
			assert.Zero(t, env.requests(t, "http", decision.SignalTraces, "denied", "budget"))
			unhold()
			released(t, env, hw)
		})
	}

	t.Run("chunked too big alone", func(t *testing.T) {
		env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
		hw := hostileHighWater(t, env)
		r := send(t, env, pbType, chunked, hostileChunked(tooBig, 4<<10))
		require.Equal(t, http.StatusOK, r.StatusCode, "%q", r.body)
		assert.Equal(t, tooBigSpans, env.traces.SpanCount())
		assert.EqualValues(t, hostileBudget, hw.Load(), "it holds the whole budget, never more, and reads the rest in the oversize lane")
		released(t, env, hw)
	})

	t.Run("chunked 8MiB server bytes", func(t *testing.T) {
		env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
		hw := hostileHighWater(t, env)
		unhold := hostileHold(t, env)
		p := startE2ECountingProxy(t, env.httpAddr)
		const size = 8 << 20
		raw := append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", "Host: x", "Content-Type: "+pbType, chunked[0]),
			hostileChunked(make([]byte, size), 32<<10)...)
		r := hostileRaw(t, p.ln.Addr().String(), raw, false)
		requireBudgetCutOff(t, r, pbType)
		require.NoError(t, p.ln.Close())
		<-p.done
		fwd := p.forwarded.Load()
		t.Logf("handed %d bytes of a %d byte chunked body to the server's socket", fwd, size)
		// The budget, net/http's post-handler drain (256 KiB) and the
		// kernel buffers (the server's receive buffer grows while it
		// reads those, by how much depends on the machine's load): a
		// fraction of the 8 MiB body, at most half of it.
		assert.Less(t, fwd, int64(size/2))
		assert.Zero(t, env.traces.SpanCount())
		unhold()
		released(t, env, hw)
	})

	t.Run("gzip charged decompressed", func(t *testing.T) {
		env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
		hw := hostileHighWater(t, env)
		gz := hostileGzip(t, fits)
		require.Less(t, len(gz), hostileUnknown, "the compressed body fits in the first reservation")
		r := send(t, env, pbType, []string{"Content-Encoding: gzip", "Content-Length: " + strconv.Itoa(len(gz))}, gz)
		require.Equal(t, http.StatusOK, r.StatusCode, "%q", r.body)
		assert.Equal(t, fitsSpans, env.traces.SpanCount())
		t.Logf("gzip: %d bytes on the wire, %d decompressed, budget high water %d", len(gz), len(fits), hw.Load())
		assert.GreaterOrEqual(t, hw.Load(), int64(len(fits)), "charged the decompressed size, not the %d compressed bytes", len(gz))
		released(t, env, hw)
	})

	t.Run("gzip too big decompressed", func(t *testing.T) {
		env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
		hw := hostileHighWater(t, env)
		gz := hostileGzip(t, tooBig)
		require.Less(t, len(gz), hostileBudget, "the compressed body alone would fit the budget")
		unhold := hostileHold(t, env)
		r := send(t, env, pbType, []string{"Content-Encoding: gzip", "Content-Length: " + strconv.Itoa(len(gz))}, gz)
		requireBudgetCutOff(t, r, pbType)
		assert.Zero(t, env.traces.SpanCount())
		unhold()
		released(t, env, hw)

		// Alone, the same request runs with the whole budget.
		r = send(t, env, pbType, []string{"Content-Encoding: gzip", "Content-Length: " + strconv.Itoa(len(gz))}, gz)
		require.Equal(t, http.StatusOK, r.StatusCode, "%q", r.body)
		assert.Equal(t, tooBigSpans, env.traces.SpanCount())
		assert.EqualValues(t, hostileBudget, hw.Load())
		released(t, env, hw)
	})

	t.Run("declared size over budget", func(t *testing.T) {
		// A Content-Length larger than the whole budget, while another
		// request holds part of it, is admitted with its first reservation
		// (refused up front, it could starve under steady load). It grows
		// into what the other leaves, then waits wait_timeout for more; as
		// the other request does not finish, it is cut off with the
		// budget's 429 + Retry-After 1.
		env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
		hw := hostileHighWater(t, env)
		unhold := hostileHold(t, env)
		const size = hostileBudget + 1
		head := []string{"Host: x", "Content-Type: " + pbType, "Content-Length: " + strconv.Itoa(size)}
		r := hostileRaw(t, env.httpAddr, append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", head...), make([]byte, size)...), false)
		requireBudgetCutOff(t, r, pbType)
		assert.EqualValues(t, 2, env.requests(t, "http", decision.SignalTraces, "allowed", ""), "the held body and this one")
		assert.Zero(t, env.requests(t, "http", decision.SignalTraces, "denied", "budget"))
		assert.Zero(t, env.traces.SpanCount())
		unhold()
		released(t, env, hw)
	})

	t.Run("declared size over budget alone", func(t *testing.T) {
		// With nothing else reserved, a Content-Length over the whole
		// budget holds the whole budget, reads the rest in the oversize
		// lane and is delivered.
		env := startE2E(t, e2eOptions{conf: hostileBudgetConf()})
		hw := hostileHighWater(t, env)
		body, spans := hostileTraces(t, hostileBudget+1)
		r := send(t, env, pbType, []string{"Content-Length: " + strconv.Itoa(len(body))}, body)
		require.Equal(t, http.StatusOK, r.StatusCode, "%q", r.body)
		assert.Equal(t, spans, env.traces.SpanCount())
		assert.EqualValues(t, 1, env.requests(t, "http", decision.SignalTraces, "allowed", ""))
		assert.Zero(t, env.requests(t, "http", decision.SignalTraces, "denied", "budget"))
		assert.EqualValues(t, hostileBudget, hw.Load(), "the whole budget, never more")
		released(t, env, hw)
	})
}

// TestHostileCompressedBodyReadBeforeThrottle measures, through a counting
// proxy, what the server reads of a 2 MiB compressed body rejected in Open.
// confighttp runs the middlewares after its decompressor, which builds the
// decoder before the throttle sees the request: gzip, deflate and zstd only
// read their header then, lz4 and x-snappy-framed nothing, so the rest stays
// unread as with no encoding; but "snappy" (the block format) is read and
// decoded in full by the decoder's constructor. That is a limitation of
// confighttp's order, outside the throttle: the 429 still comes, but only
// after the whole body has been read and decompressed (up to
// max_request_body_size, 20 MiB by default, allocated per request).
// Operators can refuse the block format with the receiver's
// compression_algorithms (x-snappy-framed streams).
func TestHostileCompressedBodyReadBeforeThrottle(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	const size = 2 << 20
	// Incompressible, so the compressed bodies are about 2 MiB too.
	plain := make([]byte, size)
	_, err := rand.Read(plain)
	require.NoError(t, err)
	var sb bytes.Buffer
	sw := snappy.NewBufferedWriter(&sb)
	_, err = sw.Write(plain)
	require.NoError(t, err)
	require.NoError(t, sw.Close())

	cases := []struct {
		encoding string
		body     []byte
		readAll  bool
	}{
		{"", plain, false},
		{"gzip", hostileGzip(t, plain), false},
		{"deflate", hostileZlib(t, plain), false},
		{"zstd", hostileZstd(t, plain), false},
		{"lz4", hostileLZ4(t, plain), false},
		{"x-snappy-framed", sb.Bytes(), false},
		{"snappy", snappy.Encode(nil, plain), true},
	}
	for _, tc := range cases {
		p := startE2ECountingProxy(t, env.httpAddr)
		h := []string{"Host: x", "Content-Type: " + pbType, "Content-Length: " + strconv.Itoa(len(tc.body))}
		if tc.encoding != "" {
			h = append(h, "Content-Encoding: "+tc.encoding)
		}
		r := hostileRaw(t, p.ln.Addr().String(), append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", h...), tc.body...), false)
		requireHTTPRejection(t, r.e2e(), pbType, true)
		require.NoError(t, p.ln.Close())
		<-p.done
		fwd := p.forwarded.Load()
		t.Logf("Content-Encoding %q: %d of %d body bytes handed to the server", tc.encoding, fwd, len(tc.body))
		if tc.readAll {
			assert.GreaterOrEqual(t, fwd, int64(len(tc.body)), "%q: expected to be read in full (confighttp limitation)", tc.encoding)
		} else {
			assert.Less(t, fwd, int64(1<<20), "%q", tc.encoding)
		}
	}
	assert.Zero(t, env.traces.SpanCount())
	assert.EqualValues(t, len(cases), env.requests(t, "http", decision.SignalTraces, "denied", "open"))
}

// hostileSilentStream opens a gRPC stream on method and sends its headers,
// never a message.
func hostileSilentStream(ctx context.Context, cc *grpc.ClientConn, method string) (grpc.ClientStream, error) {
	return cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
}

// TestHostileGRPCSilentStreamOpen: in Open, streams that send their headers
// and never a message (nor half-close) are answered RESOURCE_EXHAUSTED +
// RetryInfo straight away, for every OTLP service: the tap decides on the
// headers. 50 of them on one connection leave the server responsive.
func TestHostileGRPCSilentStreamOpen(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()

	routes := middleware.DefaultRoutes().GRPC
	require.Len(t, routes, 4)
	const perMethod = 50
	for method, sig := range routes {
		for range perMethod {
			start := time.Now()
			cs, err := hostileSilentStream(ctx, cc, method)
			require.NoError(t, err)
			err = cs.RecvMsg(&emptypb.Empty{})
			requireGRPCRejection(t, err)
			assert.Less(t, time.Since(start), e2eWait/2, "answered while the client still had not sent anything")
		}
		assert.EqualValues(t, perMethod, env.requests(t, "grpc", sig, "denied", "open"), "%v", sig)
		assert.Zero(t, env.requests(t, "grpc", sig, "allowed", ""))
	}
	requireGRPCRejection(t, e2eSignals[0].grpcExport(ctx, cc, 1))
	for _, s := range e2eSignals {
		assert.Zero(t, s.received(env))
	}
}

// hostileGRPCConf is the throttle configuration of the silent gRPC stream
// tests: a budget of four messages of grpc_max_message_size (64 KiB, the
// least), which is what a gRPC call holds from before its message is read
// until it has been decoded, since grpc-go decodes the whole message before
// anything sees its size.
func hostileGRPCConf() map[string]any {
	conf := hostileBudgetConf()
	adm := conf["admission"].(map[string]any)
	adm["max_inflight_bytes"] = hostileGRPCBudget
	adm["grpc_max_message_size"] = hostileGRPCMessage
	return conf
}

const (
	hostileGRPCMessage = 64 << 10
	hostileGRPCBudget  = 4 * hostileGRPCMessage
)

// TestHostileGRPCSilentStreamNormal: in Normal a silent stream is admitted
// and holds what its message may decode to, grpc_max_message_size (not the
// small unknown_size: a message of that size could arrive at any time), for
// as long as it is open; the client's cancel releases it (the gauge goes
// back to 0).
func TestHostileGRPCSilentStreamNormal(t *testing.T) {
	env := startE2E(t, e2eOptions{conf: hostileGRPCConf()})
	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	cs, err := hostileSilentStream(sctx, cc, hostileTracesMethod)
	require.NoError(t, err)
	recvErr := make(chan error, 1)
	go func() { recvErr <- cs.RecvMsg(&emptypb.Empty{}) }()

	require.Eventually(t, func() bool { return hostileReserved(env) == hostileGRPCMessage }, e2eWait, time.Millisecond,
		"the silent stream does not hold what its message may decode to")
	assert.EqualValues(t, 1, env.requests(t, "grpc", decision.SignalTraces, "allowed", ""))
	select {
	case err := <-recvErr:
		t.Fatalf("the silent stream ended on its own: %v", err)
	default:
	}

	scancel()
	assert.Equal(t, codes.Canceled, status.Code(<-recvErr))
	require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond,
		"the reservation was not released when the client cancelled")
	assert.Zero(t, env.traces.SpanCount())
}

// TestHostileGRPCSilentStreamFlood: in Normal, 200 silent traces streams
// against a budget of four messages with metrics exempt: the traces may
// take three quarters of the budget, so three streams are admitted and
// hold it, and the other 197 are refused at once (wait_timeout 0), either
// at the tap with RESOURCE_EXHAUSTED + RetryInfo or, let in by the tap
// and refused before their message is read, cancelled; both are counted as
// budget denials and both are retried by the OTLP exporters. Meanwhile the
// server answers at once, refusing traces on both protocols (the budget is
// shared) and admitting the exempt signal in the quarter the traces cannot
// take. After the cancel everything is released.
func TestHostileGRPCSilentStreamFlood(t *testing.T) {
	conf := hostileGRPCConf()
	conf["admission"].(map[string]any)["wait_timeout"] = "0s"
	conf["rules"] = map[string]any{"metrics": map[string]any{"enabled": false}}
	env := startE2E(t, e2eOptions{conf: conf})
	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()

	const streams, fit = 200, hostileGRPCBudget * 3 / 4 / hostileGRPCMessage
	errs := make(chan error, streams)
	var wg sync.WaitGroup
	for range streams {
		cs, err := hostileSilentStream(sctx, cc, hostileTracesMethod)
		require.NoError(t, err)
		wg.Go(func() { errs <- cs.RecvMsg(&emptypb.Empty{}) })
	}
	require.Eventually(t, func() bool {
		return env.requests(t, "grpc", decision.SignalTraces, "denied", "budget") == streams-fit &&
			env.requests(t, "grpc", decision.SignalTraces, "allowed", "") == fit &&
			hostileReserved(env) == fit*hostileGRPCMessage
	}, e2eWait, time.Millisecond, "not every stream was decided")
	var exhausted, cancelled int
	for range streams - fit {
		err := <-errs
		if status.Code(err) == codes.Canceled {
			cancelled++
			continue
		}
		requireGRPCRejection(t, err)
		exhausted++
	}
	t.Logf("refused at the tap: %d, cancelled before their message: %d", exhausted, cancelled)

	// Responsive: refused at once by the budget the silent streams hold,
	// but for the exempt signal, in its reserve.
	require.NoError(t, e2eSignals[1].grpcExport(ctx, cc, 3), "the exempt signal is admitted in its reserve")
	requireGRPCRejection(t, e2eSignals[0].grpcExport(ctx, cc, 1))
	c := e2eHTTPClient(t)
	tb, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	r := env.post(t, c, "/v1/traces", pbType, tb)
	requireBudgetCutOff(t, hostileResp{Response: r.Response, body: r.body}, pbType)
	assert.EqualValues(t, 1, env.requests(t, "http", decision.SignalTraces, "denied", "budget"))
	mb, err := e2eSignals[1].proto(4)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, env.post(t, c, "/v1/metrics", pbType, mb).StatusCode)
	assert.Zero(t, env.traces.SpanCount())
	assert.Equal(t, 3+4, env.metrics.DataPointCount())
	assert.LessOrEqual(t, hostileHighWater(t, env).Load(), int64(hostileGRPCBudget))

	scancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	}
	require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond,
		"the admitted streams were not released")
}

// hostileH2Call opens a cleartext HTTP/2 connection to addr (prior
// knowledge), sends one HEADERS frame with fields and without END_STREAM
// (the client would send its message later, and never does) and returns the
// response header fields of the stream (headers and trailers merged) when
// the server ends it.
func hostileH2Call(t *testing.T, addr string, fields ...hpack.HeaderField) map[string]string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, e2eWait)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(e2eWait)))
	_, err = io.WriteString(conn, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	require.NoError(t, fr.WriteSettings())
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range fields {
		require.NoError(t, enc.WriteField(f))
	}
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}))
	got := map[string]string{}
	for {
		f, err := fr.ReadFrame()
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, fr.WriteSettingsAck())
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				require.NoError(t, fr.WritePing(true, f.Data))
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID != 1 {
				continue
			}
			for _, hf := range f.Fields {
				got[hf.Name] = hf.Value
			}
			if f.StreamEnded() {
				return got
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				got["rst"] = f.ErrCode.String()
				return got
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		}
	}
}

// hostileRetryInfo decodes the RetryInfo of a grpc-status-details-bin value.
func hostileRetryInfo(t *testing.T, v string) *errdetails.RetryInfo {
	t.Helper()
	b, err := base64.RawStdEncoding.DecodeString(v)
	if err != nil {
		b, err = base64.StdEncoding.DecodeString(v)
	}
	require.NoError(t, err)
	st := &spb.Status{}
	require.NoError(t, proto.Unmarshal(b, st))
	for _, d := range status.FromProto(st).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri
		}
	}
	return nil
}

// TestHostileGRPCNotClassified: in Open, raw HTTP/2 requests to the gRPC
// server. A non-gRPC content-type is refused by grpc-go (415) before the
// tap; a :path that is not exactly an OTLP method (unknown service, no
// leading slash, doubled slash, other case, trailing slash, query, percent
// encoding) is not classified, and grpc-go does not route it to the OTLP
// service either: Unimplemented. None of them is counted. The controls with
// the exact method (and any application/grpc content-subtype) are rejected
// RESOURCE_EXHAUSTED + RetryInfo, which shows the raw client reaches the tap.
func TestHostileGRPCNotClassified(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	const (
		rejected      = "8"  // ResourceExhausted
		invalidArg    = "3"  // InvalidArgument
		unimplemented = "12" // Unimplemented
		internal      = "13" // Internal
	)
	cases := []struct {
		name, method, path, contentType string
		httpStatus, grpcStatus          string
	}{
		{"control", http.MethodPost, hostileTracesMethod, "application/grpc", "200", rejected},
		{"control +proto", http.MethodPost, hostileTracesMethod, "application/grpc+proto", "200", rejected},
		{"control +json", http.MethodPost, hostileTracesMethod, "application/grpc+json", "200", rejected},
		{"json content-type", http.MethodPost, hostileTracesMethod, "application/json", "415", invalidArg},
		{"protobuf content-type", http.MethodPost, hostileTracesMethod, "application/x-protobuf", "415", invalidArg},
		{"no content-type", http.MethodPost, hostileTracesMethod, "", "415", invalidArg},
		{"GET", http.MethodGet, hostileTracesMethod, "application/grpc", "405", internal},
		{"unknown service", http.MethodPost, "/foo.Bar/Export", "application/grpc", "200", unimplemented},
		{"unknown method", http.MethodPost, "/opentelemetry.proto.collector.trace.v1.TraceService/Push", "application/grpc", "200", unimplemented},
		{"no leading slash", http.MethodPost, hostileTracesMethod[1:], "application/grpc", "200", unimplemented},
		{"double slash", http.MethodPost, "/" + hostileTracesMethod, "application/grpc", "200", unimplemented},
		{"trailing slash", http.MethodPost, hostileTracesMethod + "/", "application/grpc", "200", unimplemented},
		{"query", http.MethodPost, hostileTracesMethod + "?x=1", "application/grpc", "200", unimplemented},
		{"lower case", http.MethodPost, strings.ToLower(hostileTracesMethod), "application/grpc", "200", unimplemented},
		{"percent-encoded", http.MethodPost, strings.Replace(hostileTracesMethod, "Export", "%45xport", 1), "application/grpc", "200", unimplemented},
	}
	controls := 0
	for _, tc := range cases {
		fields := []hpack.HeaderField{
			{Name: ":method", Value: tc.method},
			{Name: ":scheme", Value: "http"},
			{Name: ":path", Value: tc.path},
			{Name: ":authority", Value: env.grpcAddr},
		}
		if tc.contentType != "" {
			fields = append(fields, hpack.HeaderField{Name: "content-type", Value: tc.contentType})
		}
		fields = append(fields, hpack.HeaderField{Name: "te", Value: "trailers"})
		got := hostileH2Call(t, env.grpcAddr, fields...)
		assert.Equal(t, tc.httpStatus, got[":status"], "%s: %v", tc.name, got)
		assert.Equal(t, tc.grpcStatus, got["grpc-status"], "%s: %v", tc.name, got)
		if tc.grpcStatus == rejected {
			controls++
			ri := hostileRetryInfo(t, got["grpc-status-details-bin"])
			require.NotNil(t, ri, "%s: no RetryInfo", tc.name)
			assert.GreaterOrEqual(t, ri.GetRetryDelay().AsDuration(), e2eRetryLow)
			assert.LessOrEqual(t, ri.GetRetryDelay().AsDuration(), e2eRetryHigh)
		}
	}
	assert.EqualValues(t, controls, env.requests(t, "grpc", decision.SignalTraces, "denied", "open"))
	assert.Zero(t, env.requests(t, "grpc", decision.SignalTraces, "allowed", ""))
	assert.Zero(t, env.traces.SpanCount())
}

// TestHostileCompressedExpectContinue: in Open, a compressed request sent
// head only with "Expect: 100-continue" (the body waits for the server's
// go-ahead). confighttp builds the decoder before the middlewares run:
//   - identity, zstd, lz4 and x-snappy-framed decoders are lazy: the throttle
//     answers 429 without asking for the body. For lz4 and x-snappy-framed,
//     confighttp's deferred Close of the decoder closes the request body
//     inside the handler, which net/http turns into a drain of up to 256 KiB
//     that blocks until the client sends them; the 429 must already have
//     been flushed then, or the client never sees it.
//   - gzip, deflate and snappy read the body (header, or all of it for
//     snappy) in the decoder's constructor: the server asks for the body
//     (100 Continue) before the throttle decides, and the 429 comes once it
//     has been sent.
//   - an unsupported encoding is refused 400 by the decompressor, before
//     the throttle: not counted.
func TestHostileCompressedExpectContinue(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	plain, err := e2eSignals[0].proto(3)
	require.NoError(t, err)
	cases := []struct {
		encoding   string
		body       []byte
		asksBody   bool // the server answers 100 Continue first
		badRequest bool
	}{
		{"", plain, false, false},
		{"zstd", hostileZstd(t, plain), false, false},
		{"lz4", hostileLZ4(t, plain), false, false},
		{"x-snappy-framed", nil, false, false},
		{"gzip", hostileGzip(t, plain), true, false},
		{"deflate", hostileZlib(t, plain), true, false},
		{"snappy", snappy.Encode(nil, plain), true, false},
		{"br", plain, false, true},
	}
	var sb bytes.Buffer
	sw := snappy.NewBufferedWriter(&sb)
	_, err = sw.Write(plain)
	require.NoError(t, err)
	require.NoError(t, sw.Close())
	cases[3].body = sb.Bytes()

	counted := 0
	for _, tc := range cases {
		h := []string{"Host: x", "Content-Type: " + pbType, "Content-Length: " + strconv.Itoa(len(tc.body)), "Expect: 100-continue"}
		if tc.encoding != "" {
			h = append(h, "Content-Encoding: "+tc.encoding)
		}
		func() {
			conn, err := net.DialTimeout("tcp", env.httpAddr, e2eWait)
			require.NoError(t, err)
			defer conn.Close()
			// Shorter than e2eWait: a 429 that is not flushed shows as a
			// timeout here.
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
			_, err = conn.Write(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", h...))
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
			require.NoError(t, err, "Content-Encoding %q: no answer to the head", tc.encoding)
			if tc.asksBody {
				require.Equal(t, http.StatusContinue, resp.StatusCode, "Content-Encoding %q", tc.encoding)
				_, err = conn.Write(tc.body)
				require.NoError(t, err)
				resp, err = http.ReadResponse(br, &http.Request{Method: http.MethodPost})
				require.NoError(t, err)
			}
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			if tc.badRequest {
				assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "Content-Encoding %q", tc.encoding)
				return
			}
			counted++
			requireHTTPRejection(t, e2eResponse{Response: resp, body: b}, pbType, true)
		}()
	}
	assert.Zero(t, env.traces.SpanCount())
	assert.EqualValues(t, counted, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
}
