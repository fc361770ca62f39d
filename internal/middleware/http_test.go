// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

// failingBody fails the test if anything reads it.
type failingBody struct {
	t      testing.TB
	closed atomic.Bool
}

func (b *failingBody) Read([]byte) (int, error) {
	b.t.Error("the request body was read")
	return 0, io.EOF
}

func (b *failingBody) Close() error { b.closed.Store(true); return nil }

// countingHandler counts calls and reads the whole body, like otlpreceiver.
type countingHandler struct {
	calls   atomic.Int64
	readErr atomic.Pointer[error]
	read    atomic.Int64
}

func (h *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	n, err := io.Copy(io.Discard, r.Body)
	h.read.Add(n)
	if err != nil {
		h.readErr.Store(&err)
		writeReadError(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// writeReadError answers a failed body read as otlpreceiver does: a gRPC
// status error by its code (RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, with
// Retry-After from its RetryInfo), anything else 400, which the OTLP
// exporters drop.
func writeReadError(w http.ResponseWriter, err error) {
	st, ok := status.FromError(err)
	if !ok {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	code := http.StatusBadRequest
	switch st.Code() {
	case codes.ResourceExhausted:
		code = http.StatusTooManyRequests
	case codes.Unavailable:
		code = http.StatusServiceUnavailable
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(ri.GetRetryDelay().AsDuration()/time.Second), 10))
		}
	}
	http.Error(w, err.Error(), code)
}

type httpFixture struct {
	*admFixture
	mw   *HTTP
	next *countingHandler
	h    http.Handler
}

// newHTTPFixture is the HTTP middleware on a new admission (see newAdm)
// with the route /prometheus/write for metrics, in front of a
// countingHandler.
func newHTTPFixture(tb testing.TB, budget int64, opts ...admOption) *httpFixture {
	tb.Helper()
	return newHTTPFixtureOn(tb, newAdm(tb, budget, opts...))
}

// newHTTPFixtureOn is the HTTP middleware on the admission a (shared with
// a gRPC fixture, say).
func newHTTPFixtureOn(tb testing.TB, a *admFixture) *httpFixture {
	tb.Helper()
	f := &httpFixture{admFixture: a, next: &countingHandler{}}
	cfg := Config{
		Classifier: mustClassifier(tb, Routes{HTTP: map[string]decision.Signal{"/prometheus/write": decision.SignalMetrics}}),
		Admission:  a.adm,
	}
	for _, e := range a.setup.mw {
		e(&cfg)
	}
	mw, err := NewHTTP(cfg)
	require.NoError(tb, err)
	f.mw = mw
	f.h = mw.Wrap(f.next)
	return f
}

// withRetry sets the middleware's retry delays.
func withRetry(d *RetryDelay) admOption { return withMiddleware(func(c *Config) { c.Retry = d }) }

// serve serves req with h and returns the answer.
func serve(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// post is a request to path from remote with a body of n bytes and its
// Content-Length.
func post(path, remote string, n int) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(make([]byte, n)))
	req.RemoteAddr = remote
	return req
}

func TestNewHTTPErrors(t *testing.T) {
	a := newAdm(t, 0)
	_, err := NewHTTP(Config{Admission: a.adm})
	require.ErrorIs(t, err, errNoClassifier)
	_, err = NewHTTP(Config{Classifier: mustClassifier(t, Routes{})})
	require.ErrorIs(t, err, errNoAdmission)
	_, err = NewGRPC(Config{})
	require.Error(t, err)
}

func TestHTTPAdmit(t *testing.T) {
	f := newHTTPFixture(t, 1<<20)
	for _, target := range []string{"/v1/traces", "/v1/metrics?x=1", "//v1/logs/", "/prometheus/write", "/health", "/"} {
		rec := serve(f.h, httptest.NewRequest(http.MethodPost, target, strings.NewReader("hello")))
		assert.Equal(t, http.StatusOK, rec.Code, target)
	}
	assert.EqualValues(t, 6, f.next.calls.Load())
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictAdmit))
	assert.EqualValues(t, 2, f.rec.get(protoHTTP, decision.SignalMetrics, decision.VerdictAdmit))
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalLogs, decision.VerdictAdmit))
	assert.EqualValues(t, 4, f.rec.total(), "unclassified requests are not counted")
	s := f.stats()
	assert.Zero(t, s.Reserved)
	assert.Zero(t, s.Inflight)
	assert.EqualValues(t, 5, s.Peak, "a body reserves its Content-Length when smaller than unknown_size")
}

// TestHTTPUnclassifiedNeverRejected: Open on every signal and a full budget
// still let a health check through, and no decision is even asked for.
func TestHTTPUnclassifiedNeverRejected(t *testing.T) {
	f := newHTTPFixture(t, 10)
	defer f.reserve(t, "10.255.0.1", decision.SignalTraces, 10)()
	f.dec.setAll(decision.VerdictDenyOpen)
	decides, recorded := f.dec.decides.Load(), f.rec.total()
	for _, target := range []string{"/health", "/v1/trace", "/metrics", "/v1/traces/x"} {
		rec := serve(f.h, httptest.NewRequest(http.MethodPost, target, strings.NewReader("0123456789")))
		assert.Equal(t, http.StatusOK, rec.Code, target)
	}
	assert.Equal(t, decides, f.dec.decides.Load())
	assert.Equal(t, recorded, f.rec.total())
	assert.EqualValues(t, 10, f.stats().Reserved, "only the other request's bytes")
}

// TestHTTPExempt: an exempt signal's own decision admits it in Open (only
// the engine's memory backstop refuses it), and the admission budget bounds
// its bytes (a metrics body of any size is not let in between two samples
// because metrics are exempt): the other signals may take only three
// quarters of the budget, so that filling it does not refuse the exempt
// ones, which may take all of it and nothing more.
func TestHTTPExempt(t *testing.T) {
	const budget = 1000
	f := newHTTPFixture(t, budget, withExempt(decision.SignalMetrics))
	f.dec.setAll(decision.VerdictDenyOpen)
	f.dec.set(decision.SignalMetrics, decision.VerdictAdmit)
	rec := serve(f.h, post("/v1/metrics", "192.0.2.1:1", budget))
	assert.Equal(t, http.StatusOK, rec.Code, "admitted in Open, the whole budget")
	rec = serve(f.h, httptest.NewRequest(http.MethodPost, "/v1/traces", &failingBody{t: t}))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalMetrics, decision.VerdictAdmit))
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyOpen))
	assert.Zero(t, f.stats().Reserved)

	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	releaseTraces := f.reserve(t, "10.255.0.1", decision.SignalTraces, budget*3/4)
	rec = serve(f.h, post("/v1/traces", "192.0.2.1:1", 2))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "the others may take three quarters of the budget")
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	rec = serve(f.h, post("/v1/metrics", "192.0.2.1:1", budget/4))
	assert.Equal(t, http.StatusOK, rec.Code, "the others filling what they may do not refuse an exempt signal")
	assert.EqualValues(t, 2, f.rec.get(protoHTTP, decision.SignalMetrics, decision.VerdictAdmit))

	releaseMetrics := f.reserve(t, "10.255.0.2", decision.SignalMetrics, budget/4)
	rec = serve(f.h, post("/v1/metrics", "192.0.2.1:1", 2))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "nothing reserves past the budget, exempt or not")
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalMetrics, decision.VerdictDenyBudget))
	assert.LessOrEqual(t, f.stats().Peak, int64(budget))
	releaseTraces()
	releaseMetrics()
	assert.Zero(t, f.stats().Reserved)

	f.dec.set(decision.SignalMetrics, decision.VerdictDenyOpen) // the memory backstop
	rec = serve(f.h, httptest.NewRequest(http.MethodPost, "/v1/metrics", &failingBody{t: t}))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalMetrics, decision.VerdictDenyOpen))
}

// TestHTTPExemptKeyExtra: an exempt request may take its key's limit over
// by a quarter of the budget, where the others of its key are refused
// before their body is read.
func TestHTTPExemptKeyExtra(t *testing.T) {
	const budget = 1000
	f := newHTTPFixture(t, budget, withDefaultShare(), withExempt(decision.SignalMetrics))
	const a = "10.0.0.1"
	defer f.reserve(t, a, decision.SignalMetrics, budget/2)()
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", &failingBody{t: t})
	req.RemoteAddr, req.ContentLength = a+":1", 10
	rec := serve(f.h, req)
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "the key is at its limit: refused unread")
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	rec = serve(f.h, post("/v1/metrics", a+":1", budget/4))
	assert.Equal(t, http.StatusOK, rec.Code, "an exempt body of the same key, within a quarter of the budget over its limit")
	rec = serve(f.h, post("/v1/metrics", a+":1", budget/4+1))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "no further")
}

func TestHTTPRejection(t *testing.T) {
	contentTypes := []struct {
		ct    string
		proto bool
	}{
		{"application/x-protobuf", true},
		{"application/x-protobuf; charset=binary", true},
		{"Application/X-Protobuf", true},
		{"application/json", false},
		{"application/json; charset=utf-8", false},
		{"", false},
		{"text/plain", false},
		{"application/x-protobuf; =broken", false}, // otlpreceiver falls back to JSON too
	}
	verdicts := []decision.Verdict{decision.VerdictDenyShed, decision.VerdictDenyOpen, decision.VerdictDenyBudget}
	for _, v := range verdicts {
		for _, ct := range contentTypes {
			t.Run(v.Reason()+"/"+ct.ct, func(t *testing.T) {
				retry := withRetry(NewRetryDelay(0, 30*time.Second, nil, nil))
				var f *httpFixture
				others := int64(0)
				if v == decision.VerdictDenyBudget {
					// The request's key already holds its share of the
					// budget: it is refused before its body is read.
					f = newHTTPFixture(t, 100, withDefaultShare(), retry)
					defer f.reserve(t, "192.0.2.1", decision.SignalTraces, 50)()
					others = 1
				} else {
					f = newHTTPFixture(t, 0, retry)
					f.dec.set(decision.SignalTraces, v)
				}
				body := &failingBody{t: t}
				req := httptest.NewRequest(http.MethodPost, "/v1/traces?x=y", body)
				req.ContentLength = 1000
				if ct.ct != "" {
					req.Header.Set("Content-Type", ct.ct)
				}
				rec := serve(f.h, req)

				assert.Equal(t, http.StatusTooManyRequests, rec.Code)
				assert.Zero(t, f.next.calls.Load(), "next must not run")
				assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, v))
				assert.Equal(t, 1+others, f.rec.total())
				secs, err := strconv.Atoi(rec.Header().Get("Retry-After"))
				require.NoError(t, err)
				assert.GreaterOrEqual(t, secs, 0)
				assert.LessOrEqual(t, secs, 30)
				if v == decision.VerdictDenyBudget {
					assert.Equal(t, 1, secs, "short delay for a full budget")
				}
				if v == decision.VerdictDenyOpen {
					assert.Equal(t, "close", rec.Header().Get("Connection"))
				} else {
					assert.Empty(t, rec.Header().Get("Connection"))
				}

				st := &spb.Status{}
				if ct.proto {
					assert.Equal(t, "application/x-protobuf", rec.Header().Get("Content-Type"))
					require.NoError(t, proto.Unmarshal(rec.Body.Bytes(), st))
				} else {
					assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
					require.NoError(t, protojson.Unmarshal(rec.Body.Bytes(), st))
				}
				assert.EqualValues(t, codes.ResourceExhausted, st.GetCode())
				assert.Equal(t, "throttle: collector overloaded ("+v.Reason()+")", st.GetMessage())
			})
		}
	}
}

// TestHTTPRetryAfterRange draws many rejections: every Retry-After is a
// whole number of seconds in the range and every value of the range occurs
// (Open, without an estimate of its length, draws from the whole range).
func TestHTTPRetryAfterRange(t *testing.T) {
	f := newHTTPFixture(t, 0, withRetry(NewRetryDelay(3*time.Second, 7*time.Second, nil, nil)))
	f.dec.set(decision.SignalLogs, decision.VerdictDenyOpen)
	seen := map[int]int{}
	for range 1000 {
		rec := serve(f.h, httptest.NewRequest(http.MethodPost, "/v1/logs", &failingBody{t: t}))
		secs, err := strconv.Atoi(rec.Header().Get("Retry-After"))
		require.NoError(t, err)
		require.GreaterOrEqual(t, secs, 3)
		require.LessOrEqual(t, secs, 7)
		seen[secs]++
	}
	assert.Len(t, seen, 5)
	for s, n := range seen {
		// 200 expected per value; 100 is more than 7 standard deviations away.
		assert.Greater(t, n, 100, "value %d drawn %d times", s, n)
	}
}

// countingListener counts the bytes the server reads from its connections.
type countingListener struct {
	net.Listener
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &l.read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// rejectionServer serves f over loopback and counts the bytes the server
// reads from its connections.
func rejectionServer(t *testing.T, f *httpFixture) (*httptest.Server, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := &countingListener{Listener: ln}
	srv := httptest.NewUnstartedServer(f.h)
	srv.Listener = cl
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, cl
}

// TestHTTPRejectionServerBytes sends a body to a real server over loopback
// and counts what the server reads: the headers and at most one read
// buffer, never the body. 200 KiB is under what net/http would read and
// discard on its own to keep the connection (256 KiB), so the rejection
// must close the connection itself; the client still gets its answer, and
// the announced close.
func TestHTTPRejectionServerBytes(t *testing.T) {
	for _, bodySize := range []int{4 << 20, 200 << 10} {
		for _, v := range []decision.Verdict{decision.VerdictDenyShed, decision.VerdictDenyOpen} {
			t.Run(fmt.Sprintf("%s/%d", v.Reason(), bodySize), func(t *testing.T) {
				f := newHTTPFixture(t, 0)
				f.dec.set(decision.SignalTraces, v)
				srv, cl := rejectionServer(t, f)

				conn, err := net.Dial("tcp", srv.Listener.Addr().String())
				require.NoError(t, err)
				defer conn.Close()
				head := fmt.Sprintf("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", bodySize)
				// Write the body from another goroutine: the server never
				// reads it, so the write blocks once the socket buffers are
				// full and fails when the server closes the connection.
				writeDone := make(chan struct{})
				go func() {
					defer close(writeDone)
					_, _ = conn.Write(append([]byte(head), make([]byte, bodySize)...))
				}()
				br := bufio.NewReader(conn)
				resp, err := http.ReadResponse(br, nil)
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
				assert.NotEmpty(t, resp.Header.Get("Retry-After"))
				assert.True(t, resp.Close, "the answer announces the close")
				// The server ends the connection: nothing more to read.
				_, err = br.ReadByte()
				require.Error(t, err)
				<-writeDone

				assert.Zero(t, f.next.calls.Load())
				read := cl.read.Load()
				t.Logf("server read %d bytes of a %d byte request", read, len(head)+bodySize)
				assert.Less(t, read, int64(drainMax), "the body was read")
			})
		}
	}
}

// TestHTTPRejectionSmallBodyKeepsConnection: a rejected request with a body
// of at most drainMax keeps its connection, and the client's next request
// on it is served.
func TestHTTPRejectionSmallBodyKeepsConnection(t *testing.T) {
	f := newHTTPFixture(t, 0)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	srv, _ := rejectionServer(t, f)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	br := bufio.NewReader(conn)
	send := func() *http.Response {
		t.Helper()
		body := make([]byte, drainMax)
		_, err := fmt.Fprintf(conn, "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := send()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.False(t, resp.Close)
	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	resp = send()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.EqualValues(t, drainMax, f.next.read.Load())
}

// TestHTTPRejectionTLSKeepsConnection: over TLS a rejected request with a
// large body keeps its connection in Shedding (a new one would cost a
// handshake) and closes it in Open.
func TestHTTPRejectionTLSKeepsConnection(t *testing.T) {
	for _, tc := range []struct {
		v     decision.Verdict
		reuse bool
	}{{decision.VerdictDenyShed, true}, {decision.VerdictDenyOpen, false}} {
		t.Run(tc.v.Reason(), func(t *testing.T) {
			f := newHTTPFixture(t, 0)
			f.dec.set(decision.SignalTraces, tc.v)
			srv := httptest.NewTLSServer(f.h)
			defer srv.Close()
			client := srv.Client()
			body := make([]byte, 200<<10)
			var reused []bool
			for range 2 {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/traces", bytes.NewReader(body))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/x-protobuf")
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
					GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) },
				}))
				resp, err := client.Do(req)
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
				assert.Equal(t, !tc.reuse, resp.Close)
			}
			assert.Equal(t, []bool{false, tc.reuse}, reused)
		})
	}
}

// TestHTTPRejectionGoClientGetsAnswer: Go's HTTP client, as in the OTLP HTTP
// exporter, sending bodies the rejection does not read gets every 429 with
// its Retry-After, not a connection error, and opens a new connection for
// its next request.
func TestHTTPRejectionGoClientGetsAnswer(t *testing.T) {
	f := newHTTPFixture(t, 0)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	srv, cl := rejectionServer(t, f)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	const n, bodySize = 50, 200 << 10
	body := make([]byte, bodySize)
	for i := range n {
		resp, err := client.Post(srv.URL+"/v1/traces", "application/x-protobuf", bytes.NewReader(body))
		require.NoError(t, err, "request %d", i)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "request %d", i)
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
	}
	assert.Less(t, cl.read.Load(), int64(n*drainMax), "the bodies were read")
}

// TestHTTPExpectContinueBodyNeverSent: a client that waits for 100-continue
// never has to send its body, which the test proves with a body that fails
// the test when read.
func TestHTTPExpectContinueBodyNeverSent(t *testing.T) {
	f := newHTTPFixture(t, 0)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	tr := &http.Transport{ExpectContinueTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/traces", &failingBody{t: t})
	require.NoError(t, err)
	req.ContentLength = 1 << 20
	req.Header.Set("Expect", "100-continue")
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	st := &spb.Status{}
	require.NoError(t, protojson.Unmarshal(b, st))
	assert.EqualValues(t, codes.ResourceExhausted, st.GetCode())
}

// TestHTTPObserveOnly: in observe-only mode every request is admitted and
// read, and the refusal it would have had is counted: Open, its key at its
// share, or a full budget at its first byte; nothing is held.
func TestHTTPObserveOnly(t *testing.T) {
	f := newHTTPFixture(t, 100, withObserveOnly(), withDefaultShare(), withHold(admissionWait, 8))
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", "192.0.2.1:1", 10)).Code)
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyOpen))
	assert.Zero(t, f.stats().HeldRequests)
	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)

	release := f.reserve(t, "192.0.2.1", decision.SignalLogs, 50)
	defer release()
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", "192.0.2.1:1", 10)).Code, "its key at its share")
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	release2 := f.reserve(t, "10.0.0.3", decision.SignalLogs, 40)
	defer release2()
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", "10.0.0.2:1", 40)).Code, "the budget full at its first byte")
	assert.EqualValues(t, 2, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictAdmit))
	assert.EqualValues(t, 60, f.next.read.Load(), "every body read")
}

// TestHTTPBudgetConcurrent runs many concurrent requests, with and without
// Content-Length, against a small budget: the reserved bytes never exceed
// it, some requests are refused with a short delay, every request is
// counted once, and all bytes come back.
func TestHTTPBudgetConcurrent(t *testing.T) {
	const maxBytes = 64 << 10
	a := newAdm(t, maxBytes, withUnknownSize(8<<10))
	var over atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.stats().Reserved > maxBytes {
			over.Add(1)
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			writeReadError(w, err)
			return
		}
		for range 50 { // hold the reservation a little so requests overlap
			runtime.Gosched()
		}
		w.WriteHeader(http.StatusOK)
	})
	mw, err := NewHTTP(Config{Classifier: mustClassifier(t, Routes{}), Admission: a.adm})
	require.NoError(t, err)
	h := mw.Wrap(next)

	var ok, refused, failed atomic.Int64
	var wg sync.WaitGroup
	for i := range 400 {
		wg.Go(func() {
			size := 1 + (i*7919)%(20<<10)
			req := httptest.NewRequest(http.MethodPost, "/v1/logs", bytes.NewReader(make([]byte, size)))
			if i%3 == 0 {
				req.ContentLength = -1 // chunked
				req.Body = io.NopCloser(bytes.NewReader(make([]byte, size)))
			}
			w := serve(h, req)
			switch w.Code {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				assert.Equal(t, "1", w.Header().Get("Retry-After"))
				refused.Add(1)
			default:
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	s := a.stats()
	denied := a.rec.get(protoHTTP, decision.SignalLogs, decision.VerdictDenyBudget)
	t.Logf("ok %d, refused %d (%d at their first byte), failed %d, peak %d of %d", ok.Load(), refused.Load(), denied, failed.Load(), s.Peak, maxBytes)
	assert.Zero(t, over.Load())
	assert.LessOrEqual(t, s.Peak, int64(maxBytes))
	assert.Zero(t, s.Reserved, "every reservation is released")
	assert.Zero(t, s.Inflight)
	assert.Positive(t, ok.Load())
	assert.Positive(t, refused.Load())
	assert.Zero(t, failed.Load(), "a body the budget cuts off is retryable")
	assert.EqualValues(t, 400, a.rec.total(), "each request counted once")
	assert.EqualValues(t, 400, a.rec.get(protoHTTP, decision.SignalLogs, decision.VerdictAdmit)+denied)
	assert.LessOrEqual(t, denied, refused.Load(), "a request refused at its first byte is counted as a budget denial")
}

// TestHTTPBudgetContentLength: a body reserves nothing until its first byte
// arrives, then its Content-Length when that is less than unknown_size. A
// body larger than the whole budget is refused at its first byte while
// another request holds part of the budget (retryable: it fits once the
// other finishes); alone it reserves the whole budget, never more, and
// reads on in the oversize lane, since a retryable 429 would never succeed
// and its data would be lost.
func TestHTTPBudgetContentLength(t *testing.T) {
	f := newHTTPFixture(t, 100)
	var before, during int64
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		before = f.stats().Reserved
		buf := make([]byte, 1)
		_, _ = r.Body.Read(buf)
		during = f.stats().Reserved
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			writeReadError(w, err)
		}
	}))
	assert.Equal(t, http.StatusOK, serve(h, post("/v1/traces", "192.0.2.1:1", 60)).Code)
	assert.Zero(t, before, "nothing reserved before the first byte")
	assert.EqualValues(t, 60, during)
	assert.Zero(t, f.stats().Reserved)

	release := f.reserve(t, "10.255.0.1", decision.SignalTraces, 1)
	rec := serve(f.h, post("/v1/traces", "192.0.2.1:1", 101))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.Zero(t, f.next.read.Load(), "nothing handed on")
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget), "counted as refused, not admitted")
	assert.EqualValues(t, 1, f.stats().Reserved)
	release()

	rec = serve(h, post("/v1/traces", "10.0.0.9:1", 101))
	assert.Equal(t, http.StatusOK, rec.Code, "alone it runs")
	assert.EqualValues(t, 100, during, "an over-budget body reserves the whole budget")
	assert.Zero(t, f.stats().Reserved)
	assert.EqualValues(t, 100, f.stats().Peak)

	// While it holds the budget, another body is refused.
	var inner int
	h = f.mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = r.Body.Read(make([]byte, 1))
		_, _ = io.Copy(io.Discard, r.Body)
		inner = serve(f.h, httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("x"))).Code
	}))
	assert.Equal(t, http.StatusOK, serve(h, post("/v1/traces", "192.0.2.1:1", 200)).Code)
	assert.Equal(t, http.StatusTooManyRequests, inner)
	assert.EqualValues(t, 2, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.stats().Reserved)
	assert.LessOrEqual(t, f.stats().Peak, int64(100))
}

// TestHTTPOpenWhileWaitingForBudget: a body that waited for the budget
// while its signal turned Open is answered 429 with Retry-After, as a
// request refused Open is, and nothing of it is handed on to be decoded.
func TestHTTPOpenWhileWaitingForBudget(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, maxBytes, withWait(10*time.Second))
	release := f.reserve(t, "10.255.0.1", decision.SignalLogs, maxBytes)
	got := make(chan *httptest.ResponseRecorder, 1)
	go func() { got <- serve(f.h, post("/v1/traces", "192.0.2.1:1", 16<<10)) }()
	require.Eventually(t, func() bool { return f.stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	release()
	rec := <-got
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.NotEmpty(t, rec.Header().Get("Retry-After"))
	assert.Zero(t, f.next.read.Load(), "nothing handed on")
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyOpen))
	assert.Zero(t, f.stats().Reserved)
}

// TestHTTPChunkedCannotBypass: while another request holds part of the
// budget, a body without Content-Length larger than what is left is cut off
// with a RESOURCE_EXHAUSTED read error after reading no more than that.
func TestHTTPChunkedCannotBypass(t *testing.T) {
	const maxBytes = 16 << 10
	const other = 1 << 10
	f := newHTTPFixture(t, maxBytes, withUnknownSize(4<<10), withWait(100*time.Millisecond))
	release := f.reserve(t, "10.255.0.1", decision.SignalLogs, other)
	rec := serve(f.h, chunkedTraces("192.0.2.1:1", 100<<10))

	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	errp := f.next.readErr.Load()
	require.NotNil(t, errp)
	st, ok := status.FromError(*errp)
	require.True(t, ok, "the read error is a gRPC status otlpreceiver maps to 429")
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	require.Len(t, st.Details(), 1)
	assert.LessOrEqual(t, f.next.read.Load(), int64(maxBytes-other))
	assert.Positive(t, f.next.read.Load())
	assert.EqualValues(t, maxBytes, f.stats().Peak)
	assert.EqualValues(t, other, f.stats().Reserved, "only the other request's bytes remain")
	release()
	assert.Zero(t, f.stats().Reserved)
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictAdmit), "counted once, as admitted")
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictAdmit)+
		f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
}

// TestHTTPOversizeLane: a body without Content-Length larger than its key's
// share grows to the share, then reads on in the oversize lane, a pool of
// the budget's size charged as it reads (the receiver's
// max_request_body_size bounds a body alone in it), so that a large honest
// batch is not refused for ever. Meanwhile another key is admitted in the
// rest of the budget; a second oversize body, which finds the lane's pool
// taken by the first, waits for it and is refused when its wait ends. The
// budget's reservations never pass its size.
//
// Under pressure, a key that read more in the lane lately than the others
// is refused what may need the lane, before anything is read, while a
// request of known small length still goes in; another key, which read
// less than its part, still takes the lane.
func TestHTTPOversizeLane(t *testing.T) {
	const maxBytes = 16 << 10
	const size = 100 << 10
	f := newHTTPFixture(t, maxBytes, withDefaultShare(), withUnknownSize(4<<10), withWait(50*time.Millisecond))
	const peerA, peerB = "10.0.0.1:1", "10.0.0.2:1"
	var mainPeak int64
	var other, second int
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1000)
		for {
			n, err := r.Body.Read(buf)
			f.next.read.Add(int64(n))
			mainPeak = max(mainPeak, f.keyReserved("10.0.0.1"))
			if errors.Is(err, io.EOF) {
				other = serve(f.h, chunkedTraces(peerB, 4<<10)).Code
				second = serve(f.h, chunkedTraces(peerB, size)).Code
				w.WriteHeader(http.StatusOK)
				return
			}
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
		}
	}))
	assert.Equal(t, http.StatusOK, serve(h, chunkedTraces(peerA, size)).Code)
	assert.EqualValues(t, size+4<<10+maxBytes/2, f.next.read.Load(), "the body, the other key's, and the second up to its share")
	assert.EqualValues(t, maxBytes/2, mainPeak, "it holds its key's share, never more")
	assert.Equal(t, http.StatusOK, other, "another key is admitted beside it")
	assert.Equal(t, http.StatusTooManyRequests, second, "the lane's pool is taken")
	assert.LessOrEqual(t, f.stats().Peak, int64(maxBytes))
	assert.Zero(t, f.stats().Reserved)

	assert.Equal(t, http.StatusOK, serve(f.h, chunkedTraces(peerB, size)).Code, "the lane is free again")

	for range 3 {
		require.Equal(t, http.StatusOK, serve(f.h, chunkedTraces(peerA, size)).Code, "with room, peer A's large batches go through")
	}
	f.dec.pressed.Store(true)
	assert.Equal(t, http.StatusOK, serve(f.h, chunkedTraces(peerB, size)).Code,
		"peer B read less in the lane than its part: it takes the lane under pressure")
	before := f.next.read.Load()
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, chunkedTraces(peerA, size)).Code, "peer A owes the lane")
	assert.Equal(t, before, f.next.read.Load(), "refused before anything was read")
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", peerA, 1<<10)).Code, "a small request of peer A")
	f.dec.pressed.Store(false)
	assert.Equal(t, http.StatusOK, serve(f.h, chunkedTraces(peerA, size)).Code, "with room, peer A's next large batch goes through")
	assert.Zero(t, f.stats().Reserved)
}

// TestHTTPChunkedGrows: a chunked body beyond unknown_size but within the
// budget is read in full, charged as it arrives; one exactly the budget's
// size too (the end of the body is told from an overflow).
func TestHTTPChunkedGrows(t *testing.T) {
	for _, size := range []int{0, 1, 4 << 10, 10 << 10, 16 << 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			f := newHTTPFixture(t, 16<<10, withUnknownSize(4<<10))
			var peak int64
			h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				buf := make([]byte, 1000)
				for {
					n, err := r.Body.Read(buf)
					f.next.read.Add(int64(n))
					peak = max(peak, f.stats().Reserved)
					if errors.Is(err, io.EOF) {
						w.WriteHeader(http.StatusOK)
						return
					}
					if err != nil {
						w.WriteHeader(http.StatusBadRequest)
						return
					}
				}
			}))
			rec := serve(h, chunkedTraces("192.0.2.1:1", size))
			assert.Equal(t, http.StatusOK, rec.Code)
			assert.EqualValues(t, size, f.next.read.Load())
			assert.GreaterOrEqual(t, peak, int64(min(size, 4<<10)), "charged at least what was read")
			assert.LessOrEqual(t, f.stats().Peak, int64(16<<10))
			assert.Zero(t, f.stats().Reserved)
			assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictAdmit), "counted once, an empty body too")
		})
	}
}

// TestHTTPChunkedReadAfterReturn: a body read after the handler returned
// fails instead of growing a reservation nobody would release.
func TestHTTPChunkedReadAfterReturn(t *testing.T) {
	f := newHTTPFixture(t, 1<<20, withUnknownSize(1))
	var body io.Reader
	h := f.mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { body = r.Body }))
	req := chunkedTraces("192.0.2.1:1", 6)
	h.ServeHTTP(httptest.NewRecorder(), req)
	n, err := body.Read(make([]byte, 10))
	require.Error(t, err)
	assert.Zero(t, n)
	assert.Zero(t, f.stats().Reserved)
	assert.Zero(t, f.stats().Peak)
	_, wrapped := req.Body.(*httpBody)
	assert.False(t, wrapped, "the caller's request is not modified")
}

func TestHTTPPanicReleases(t *testing.T) {
	for name, chunked := range map[string]bool{"content-length": false, "chunked": true} {
		t.Run(name, func(t *testing.T) {
			a := newAdm(t, 1<<20)
			mw, err := NewHTTP(Config{Classifier: mustClassifier(t, Routes{}), Admission: a.adm})
			require.NoError(t, err)
			var during admission.Stats
			h := mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				during = a.stats()
				panic(http.ErrAbortHandler)
			}))
			req := httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("payload"))
			if chunked {
				req.ContentLength = -1
			}
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			assert.Equal(t, http.ErrAbortHandler, recovered, "the panic goes on unchanged")
			assert.Positive(t, during.Reserved)
			assert.EqualValues(t, 1, during.Inflight)
			assert.Zero(t, a.stats().Reserved)
			assert.Zero(t, a.stats().Inflight)
		})
	}
}

// TestHTTPRealServerBudget goes through a real server and client with a
// chunked upload larger than the budget: cut off while another request
// holds part of the budget, read in full when alone.
func TestHTTPRealServerBudget(t *testing.T) {
	f := newHTTPFixture(t, 32<<10, withUnknownSize(8<<10), withWait(100*time.Millisecond))
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	ctx := context.Background()
	client := srv.Client()

	// io.MultiReader hides the length: the client sends it chunked.
	send := func(size int) *http.Response {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/traces", io.MultiReader(bytes.NewReader(make([]byte, size))))
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	assert.Equal(t, http.StatusOK, send(20<<10).StatusCode)
	release := f.reserve(t, "10.255.0.1", decision.SignalLogs, 1)
	assert.Equal(t, http.StatusTooManyRequests, send(1<<20).StatusCode)
	assert.LessOrEqual(t, f.next.read.Load(), int64(20<<10+32<<10))
	release()
	before := f.next.read.Load()
	assert.Equal(t, http.StatusOK, send(1<<20).StatusCode, "alone, it runs")
	assert.EqualValues(t, 1<<20, f.next.read.Load()-before)
	srv.Close()
	assert.Zero(t, f.stats().Reserved)
	assert.LessOrEqual(t, f.stats().Peak, int64(32<<10))
}

// TestHTTPRejectionHeldBackBody: a client that sends its headers and holds
// back a small body still gets its 429 (net/http reads an unread body of a
// kept connection before it writes the answer, and would wait on it for
// ever), and the connection is closed after it; a client that does send its
// small body keeps its connection for the next request.
func TestHTTPRejectionHeldBackBody(t *testing.T) {
	f := newHTTPFixture(t, 0)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(20*time.Second)))
	_, err = conn.Write([]byte("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"))
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "no answer while the body is held back")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.Empty(t, string(rest), "the connection whose body never came is closed")

	kept, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer kept.Close()
	require.NoError(t, kept.SetDeadline(time.Now().Add(20*time.Second)))
	kr := bufio.NewReader(kept)
	for i := range 2 {
		if i > 0 {
			time.Sleep(drainTimeout + 200*time.Millisecond) // past the drain's deadline: net/http must have set another
		}
		_, err = kept.Write(append([]byte("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"), make([]byte, 1000)...))
		require.NoError(t, err)
		resp, err = http.ReadResponse(kr, nil)
		require.NoError(t, err, "a sent body keeps the connection")
		resp.Body.Close()
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	}
}

// TestHTTPLaneHeavyPeersTakeTurns: several keys sending batches larger
// than their share, beside each other, each read no more in the oversize
// lane than its part of the work: under pressure they go on taking the lane
// in turn (large-batch clients were refused while the collector had room,
// their data lost after their retries), and a small request goes in beside
// them.
func TestHTTPLaneHeavyPeersTakeTurns(t *testing.T) {
	const maxBytes = 16 << 10
	const size = 100 << 10
	f := newHTTPFixture(t, maxBytes, withDefaultShare(), withUnknownSize(4<<10), withWait(50*time.Millisecond))
	peers := []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"}
	h := f.mw.Wrap(readAllHandler(f))
	f.dec.pressed.Store(true)
	for round := range 4 {
		for _, p := range peers {
			require.Equal(t, http.StatusOK, serve(h, chunkedTraces(p, size)).Code, "round %d, peer %s", round, p)
		}
		require.Equal(t, http.StatusOK, serve(h, chunkedTraces("10.0.0.4:1", 1<<10)).Code, "a small request of another key, round %d", round)
	}
	assert.EqualValues(t, 4*(3*size+1<<10), f.next.read.Load())
	assert.Zero(t, f.stats().Reserved)
}

// readAllHandler reads each body to its end, counting what it read in
// f.next, and answers 200, or as otlpreceiver does when the read fails.
func readAllHandler(f *httpFixture) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		f.next.read.Add(n)
		if err != nil {
			writeReadError(w, err)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}

// chunkedTraces is a traces request from remote with a body of n bytes and
// no Content-Length.
func chunkedTraces(remote string, n int) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", http.NoBody)
	req.RemoteAddr = remote
	req.ContentLength = -1
	req.Body = io.NopCloser(bytes.NewReader(make([]byte, n)))
	return req
}
