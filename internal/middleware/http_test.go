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
	dec    *fakeDecider
	rec    *countingRecorder
	budget *Budget
	// highWater watches budget from the start.
	highWater *HighWater
	mw        *HTTP
	next      *countingHandler
	h         http.Handler
}

func newHTTPFixture(tb testing.TB, budget *Budget, unknownSize int64, retry *RetryDelay, edit ...func(*Config)) *httpFixture {
	tb.Helper()
	f := &httpFixture{dec: &fakeDecider{}, rec: &countingRecorder{}, budget: budget, highWater: budget.WatchHighWater(), next: &countingHandler{}}
	cfg := Config{
		Classifier:  mustClassifier(tb, Routes{HTTP: map[string]decision.Signal{"/prometheus/write": decision.SignalMetrics}}),
		Decider:     f.dec,
		Retry:       retry,
		Budget:      budget,
		UnknownSize: unknownSize,
		Recorder:    f.rec,
	}
	for _, e := range edit {
		e(&cfg)
	}
	mw, err := NewHTTP(cfg)
	require.NoError(tb, err)
	f.mw = mw
	f.h = mw.Wrap(f.next)
	return f
}

func TestNewHTTPErrors(t *testing.T) {
	_, err := NewHTTP(Config{Decider: &fakeDecider{}})
	require.Error(t, err)
	_, err = NewHTTP(Config{Classifier: mustClassifier(t, Routes{})})
	require.Error(t, err)
	_, err = NewGRPC(Config{})
	require.Error(t, err)
}

func TestHTTPAdmit(t *testing.T) {
	f := newHTTPFixture(t, NewBudget(1<<20), 0, nil)
	for _, target := range []string{"/v1/traces", "/v1/metrics?x=1", "//v1/logs/", "/prometheus/write", "/health", "/"} {
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, target, strings.NewReader("hello")))
		assert.Equal(t, http.StatusOK, rec.Code, target)
	}
	assert.EqualValues(t, 6, f.next.calls.Load())
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit))
	assert.EqualValues(t, 2, f.rec.get(ProtocolHTTP, decision.SignalMetrics, decision.VerdictAdmit))
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalLogs, decision.VerdictAdmit))
	assert.EqualValues(t, 4, f.rec.total(), "unclassified requests are not counted")
	assert.Zero(t, f.budget.Reserved())
	assert.EqualValues(t, 5, f.highWater.Load())
}

// TestHTTPUnclassifiedNeverRejected: Open on every signal and a full budget
// still let a health check through, and Decide is not even asked.
func TestHTTPUnclassifiedNeverRejected(t *testing.T) {
	b := NewBudget(10)
	require.True(t, b.Reserve(10))
	f := newHTTPFixture(t, b, 0, nil)
	f.dec.setAll(decision.VerdictDenyOpen)
	for _, target := range []string{"/health", "/v1/trace", "/metrics", "/v1/traces/x"} {
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, target, strings.NewReader("0123456789")))
		assert.Equal(t, http.StatusOK, rec.Code, target)
	}
	assert.Zero(t, f.dec.decides.Load())
	assert.Zero(t, f.rec.total())
}

// TestHTTPExempt: an exempt signal's own decision admits it in Open (only
// the engine's memory backstop refuses it), and the admission budget bounds
// its bytes (issue 28 point 11: a metrics body of any size is not let in
// between two samples because metrics are exempt), with an overdraft of a
// second budget that the other signals filling it cannot take from it.
func TestHTTPExempt(t *testing.T) {
	b := NewBudget(16)
	f := newHTTPFixture(t, b, 0, nil)
	f.dec.setAll(decision.VerdictDenyOpen)
	f.dec.set(decision.SignalMetrics, decision.VerdictAdmit)
	f.dec.exempt[decision.SignalMetrics].Store(true)
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/metrics", strings.NewReader("0123456789abcdef")))
	assert.Equal(t, http.StatusOK, rec.Code, "admitted in Open")
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("x")))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalMetrics, decision.VerdictAdmit))
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalTraces, decision.VerdictDenyOpen))
	assert.Zero(t, b.Reserved())

	require.True(t, b.Reserve(16))
	b.charge(15, 0)
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/metrics", strings.NewReader("01")))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "the budget bounds an exempt signal too, at twice its size")
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalMetrics, decision.VerdictDenyBudget))
	b.release(15, 0)
	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("01")))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "a full budget refuses the others")
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/metrics", strings.NewReader("01")))
	assert.Equal(t, http.StatusOK, rec.Code, "within the overdraft, the others filling the budget do not refuse an exempt signal")
	assert.EqualValues(t, 2, f.rec.get(ProtocolHTTP, decision.SignalMetrics, decision.VerdictAdmit))
	assert.EqualValues(t, 16, b.Reserved(), "its bytes released")
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	b.Release(16)

	f.dec.set(decision.SignalMetrics, decision.VerdictDenyOpen) // the memory backstop
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/metrics", strings.NewReader("x")))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalMetrics, decision.VerdictDenyOpen))
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
				var f *httpFixture
				if v == decision.VerdictDenyBudget {
					// Another request holds 1 byte: the 1000-byte request
					// below would take the whole budget (runs alone), which
					// cannot be reserved until that one finishes.
					b := NewBudget(100)
					require.True(t, b.Reserve(1))
					f = newHTTPFixture(t, b, 0, NewRetryDelay(0, 30*time.Second, nil, nil))
				} else {
					f = newHTTPFixture(t, nil, 0, NewRetryDelay(0, 30*time.Second, nil, nil))
					f.dec.set(decision.SignalTraces, v)
				}
				body := &failingBody{t: t}
				req := httptest.NewRequest(http.MethodPost, "/v1/traces?x=y", body)
				req.ContentLength = 1000 // over the budget of 100, not alone
				if ct.ct != "" {
					req.Header.Set("Content-Type", ct.ct)
				}
				rec := httptest.NewRecorder()
				f.h.ServeHTTP(rec, req)

				assert.Equal(t, http.StatusTooManyRequests, rec.Code)
				assert.Zero(t, f.next.calls.Load(), "next must not run")
				assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalTraces, v))
				assert.EqualValues(t, 1, f.rec.total())
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
	f := newHTTPFixture(t, nil, 0, NewRetryDelay(3*time.Second, 7*time.Second, nil, nil))
	f.dec.set(decision.SignalLogs, decision.VerdictDenyOpen)
	seen := map[int]int{}
	for range 1000 {
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/logs", &failingBody{t: t}))
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
				f := newHTTPFixture(t, nil, 0, nil)
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
	f := newHTTPFixture(t, nil, 0, nil)
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
			f := newHTTPFixture(t, nil, 0, nil)
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
	f := newHTTPFixture(t, nil, 0, nil)
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
	f := newHTTPFixture(t, nil, 0, nil)
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

// TestHTTPBudgetConcurrent runs many concurrent requests, with and without
// Content-Length, against a small budget: the reserved bytes never exceed
// it, some requests are refused with a short delay, and all bytes come back.
func TestHTTPBudgetConcurrent(t *testing.T) {
	const maxBytes = 64 << 10
	b := NewBudget(maxBytes)
	hw := b.WatchHighWater()
	dec := &fakeDecider{}
	rec := &countingRecorder{}
	var over atomic.Int64
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b.Reserved() > maxBytes {
			over.Add(1)
		}
		_, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		for range 50 { // hold the reservation a little so requests overlap
			runtime.Gosched()
		}
		w.WriteHeader(http.StatusOK)
	})
	mw, err := NewHTTP(Config{Classifier: mustClassifier(t, Routes{}), Decider: dec, Budget: b, UnknownSize: 8 << 10, Recorder: rec})
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
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
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
	t.Logf("ok %d, refused %d, failed mid-body %d, high water %d of %d", ok.Load(), refused.Load(), failed.Load(), hw.Load(), maxBytes)
	assert.Zero(t, over.Load())
	assert.LessOrEqual(t, hw.Load(), int64(maxBytes))
	assert.Zero(t, b.Reserved(), "every reservation is released")
	assert.Positive(t, ok.Load())
	assert.Positive(t, refused.Load())
	assert.EqualValues(t, 400, rec.total())
	assert.Equal(t, refused.Load(), rec.get(ProtocolHTTP, decision.SignalLogs, decision.VerdictDenyBudget))
}

func TestHTTPBudgetContentLength(t *testing.T) {
	f := newHTTPFixture(t, NewBudget(100), 0, nil)
	var during int64
	h := f.mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { during = f.budget.Reserved() }))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(make([]byte, 60))))
	assert.EqualValues(t, 60, during)
	assert.Zero(t, f.budget.Reserved())

	// Larger than the whole budget while another request holds part of
	// it: refused up front (retryable: it fits once the other finishes),
	// body unread.
	require.True(t, f.budget.Reserve(1))
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", &failingBody{t: t})
	req.ContentLength = 101
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.EqualValues(t, 1, f.budget.Reserved())
	f.budget.Release(1)

	// The same request alone: it takes the whole budget (never more) and
	// runs; a retryable 429 would never succeed and the data would be lost.
	req = httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(make([]byte, 101)))
	h.ServeHTTP(httptest.NewRecorder(), req)
	assert.EqualValues(t, 100, during, "an over-budget request reserves the whole budget")
	assert.Zero(t, f.budget.Reserved())
	assert.EqualValues(t, 100, f.highWater.Load())

	// While it runs, nothing else is admitted, not even one byte.
	var inner int
	h = f.mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("x")))
		inner = rec.Code
	}))
	req = httptest.NewRequest(http.MethodPost, "/v1/traces", &failingBody{t: t})
	req.ContentLength = 1 << 30
	h.ServeHTTP(httptest.NewRecorder(), req)
	assert.Equal(t, http.StatusTooManyRequests, inner)
	assert.EqualValues(t, 2, f.rec.get(ProtocolHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.budget.Reserved())
	assert.LessOrEqual(t, f.highWater.Load(), int64(100))
}

// TestHTTPChunkedCannotBypass: while another request holds part of the
// budget, a body without Content-Length larger than what is left is cut off
// with a RESOURCE_EXHAUSTED read error after reading no more than that.
func TestHTTPChunkedCannotBypass(t *testing.T) {
	const maxBytes = 16 << 10
	const other = 1 << 10
	f := newHTTPFixture(t, NewBudget(maxBytes), 4<<10, nil)
	require.True(t, f.budget.Reserve(other), "another request holds part of the budget")
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", http.NoBody)
	req.ContentLength = -1
	req.Body = io.NopCloser(bytes.NewReader(make([]byte, 100<<10)))
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)

	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	errp := f.next.readErr.Load()
	require.NotNil(t, errp)
	st, ok := status.FromError(*errp)
	require.True(t, ok, "the read error is a gRPC status otlpreceiver maps to 429")
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	require.Len(t, st.Details(), 1)
	assert.LessOrEqual(t, f.next.read.Load(), int64(maxBytes-other))
	assert.Positive(t, f.next.read.Load())
	assert.EqualValues(t, maxBytes, f.highWater.Load())
	assert.EqualValues(t, other, f.budget.Reserved(), "only the other request's bytes remain")
	f.budget.Release(other)
	assert.Zero(t, f.budget.Reserved())
	assert.EqualValues(t, 1, f.rec.get(ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit), "counted once, as admitted")
}

// TestHTTPChunkedAlone: a body without Content-Length larger than its
// peer's share grows to the share, then reads on in the oversize lane
// without further charge (the receiver's max_request_body_size bounds it),
// so that a large honest batch is not refused for ever. Meanwhile another
// peer is admitted in the rest of the budget (issue 28 point 1: no body
// holds the budget from the others), a second oversize body waits for the
// lane and is refused when its wait ends, and the budget's reservations
// never pass its size.
func TestHTTPChunkedAlone(t *testing.T) {
	const maxBytes = 16 << 10
	const size = 100 << 10
	b := NewBudgetWith(BudgetConfig{Max: maxBytes, PeerShare: 0.5, Wait: 50 * time.Millisecond})
	f := newHTTPFixture(t, b, 4<<10, nil)
	const peerA, peerB = "10.0.0.1:1", "10.0.0.2:1"
	require.NotEqual(t, b.peerOfRemote(peerA), b.peerOfRemote(peerB))
	chunked := chunkedTraces
	var mainPeak int64
	var other, second int
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1000)
		for {
			n, err := r.Body.Read(buf)
			f.next.read.Add(int64(n))
			mainPeak = max(mainPeak, b.reserved.Load())
			if errors.Is(err, io.EOF) {
				rec := httptest.NewRecorder()
				f.h.ServeHTTP(rec, chunked(peerB, 4<<10))
				other = rec.Code
				rec = httptest.NewRecorder()
				f.h.ServeHTTP(rec, chunked(peerB, size))
				second = rec.Code
				w.WriteHeader(http.StatusOK)
				return
			}
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
		}
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, chunked(peerA, size))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.EqualValues(t, size+4<<10+maxBytes/2, f.next.read.Load(), "the body, the other peer's, and the second up to its share")
	assert.EqualValues(t, maxBytes/2, mainPeak, "it holds its peer's share, never more")
	assert.Equal(t, http.StatusOK, other, "another peer is admitted beside it")
	assert.Equal(t, http.StatusTooManyRequests, second, "one body in the lane at a time")
	assert.LessOrEqual(t, f.highWater.Load(), int64(maxBytes))
	assert.Zero(t, f.budget.Reserved())
	assert.Zero(t, b.laneBytes.Load())

	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, chunked(peerB, size))
	assert.Equal(t, http.StatusOK, rec.Code, "the lane is free again")

	// Peer A reads more in the lane than every other peer together: while
	// the collector is under pressure, until that is more than a window
	// old, what may need the lane is refused at once, unread, while a
	// request of known small length still goes in; peer B, which read less
	// than half of the work, still takes the lane.
	for range 3 {
		rec = httptest.NewRecorder()
		f.h.ServeHTTP(rec, chunked(peerA, size))
		require.Equal(t, http.StatusOK, rec.Code, "with room, peer A's large batches go through")
	}
	f.dec.pressed.Store(true)
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, chunked(peerB, size))
	assert.Equal(t, http.StatusOK, rec.Code, "peer B read less than the others: it takes the lane under pressure")
	before := f.next.read.Load()
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, chunked(peerA, size))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "peer A owes the lane")
	assert.Equal(t, before, f.next.read.Load(), "refused before anything was read")
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(make([]byte, 1<<10)))
	req.RemoteAddr = peerA
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusOK, rec.Code, "a small request of peer A")
	f.dec.pressed.Store(false)
	rec = httptest.NewRecorder()
	f.h.ServeHTTP(rec, chunked(peerA, size))
	assert.Equal(t, http.StatusOK, rec.Code, "with room, peer A's next large batch goes through")
}

// TestHTTPChunkedGrows: a chunked body beyond unknown_size but within the
// budget is read in full, charged as it arrives; one exactly the budget's
// size too (the end of the body is told from an overflow).
func TestHTTPChunkedGrows(t *testing.T) {
	for _, size := range []int{0, 1, 4 << 10, 10 << 10, 16 << 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			f := newHTTPFixture(t, NewBudget(16<<10), 4<<10, nil)
			var peak int64
			h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				buf := make([]byte, 1000)
				for {
					n, err := r.Body.Read(buf)
					f.next.read.Add(int64(n))
					peak = max(peak, f.budget.Reserved())
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
			req := httptest.NewRequest(http.MethodPost, "/v1/traces", http.NoBody)
			req.ContentLength = -1
			req.Body = io.NopCloser(bytes.NewReader(make([]byte, size)))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, http.StatusOK, rec.Code)
			assert.EqualValues(t, size, f.next.read.Load())
			assert.GreaterOrEqual(t, peak, int64(min(size, 4<<10)), "charged at least what was read")
			assert.Zero(t, f.budget.Reserved())
		})
	}
}

// TestHTTPChunkedReadAfterReturn: a body read after the handler returned
// fails instead of growing a reservation nobody would release.
func TestHTTPChunkedReadAfterReturn(t *testing.T) {
	f := newHTTPFixture(t, NewBudget(1<<20), 1, nil)
	var body io.Reader
	h := f.mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { body = r.Body }))
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", http.NoBody)
	req.ContentLength = -1
	req.Body = io.NopCloser(strings.NewReader("abcdef"))
	h.ServeHTTP(httptest.NewRecorder(), req)
	_, err := body.Read(make([]byte, 10))
	require.ErrorIs(t, err, http.ErrBodyReadAfterClose)
	assert.Zero(t, f.budget.Reserved())
	_, isBudget := req.Body.(*budgetBody)
	assert.False(t, isBudget, "the caller's request is not modified")
}

func TestHTTPPanicReleases(t *testing.T) {
	for name, chunked := range map[string]bool{"content-length": false, "chunked": true} {
		t.Run(name, func(t *testing.T) {
			b := NewBudget(1 << 20)
			mw, err := NewHTTP(Config{Classifier: mustClassifier(t, Routes{}), Decider: &fakeDecider{}, Budget: b})
			require.NoError(t, err)
			var during int64
			h := mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				during = b.Reserved()
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
			assert.Positive(t, during)
			assert.Zero(t, b.Reserved())
		})
	}
}

// TestHTTPRealServerBudget goes through a real server and client with a
// chunked upload larger than the budget: cut off while another request
// holds part of the budget, read in full when alone.
func TestHTTPRealServerBudget(t *testing.T) {
	f := newHTTPFixture(t, NewBudget(32<<10), 8<<10, nil)
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
	require.True(t, f.budget.Reserve(1), "another request holds part of the budget")
	assert.Equal(t, http.StatusTooManyRequests, send(1<<20).StatusCode)
	assert.LessOrEqual(t, f.next.read.Load(), int64(20<<10+32<<10))
	f.budget.Release(1)
	before := f.next.read.Load()
	assert.Equal(t, http.StatusOK, send(1<<20).StatusCode, "alone, it runs")
	assert.EqualValues(t, 1<<20, f.next.read.Load()-before)
	srv.Close()
	assert.Zero(t, f.budget.Reserved())
	assert.LessOrEqual(t, f.highWater.Load(), int64(32<<10))
}

// TestHTTPRejectionHeldBackBody: a client that sends its headers and holds
// back a small body still gets its 429 (net/http reads an unread body of a
// kept connection before it writes the answer, and would wait on it for
// ever), and the connection is closed after it; a client that does send its
// small body keeps its connection for the next request.
func TestHTTPRejectionHeldBackBody(t *testing.T) {
	f := newHTTPFixture(t, nil, 0, nil)
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
	for range 2 {
		_, err = kept.Write(append([]byte("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"), make([]byte, 1000)...))
		require.NoError(t, err)
		resp, err = http.ReadResponse(kr, nil)
		require.NoError(t, err, "a sent body keeps the connection")
		resp.Body.Close()
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		time.Sleep(2 * drainTimeout) // past the drain's deadline: net/http must have set another
	}
}

// TestHTTPLaneHeavyPeersTakeTurns: several peers sending batches larger
// than their share, beside each other, each read no more in the oversize
// lane than its part of the work: under pressure they go on taking the lane
// in turn (the client matrix's large-batch clients were refused while the
// collector had room, their data lost after their retries), and a small
// request goes in beside them.
func TestHTTPLaneHeavyPeersTakeTurns(t *testing.T) {
	const maxBytes = 16 << 10
	const size = 100 << 10
	b := NewBudgetWith(BudgetConfig{Max: maxBytes, PeerShare: 0.5, Wait: 50 * time.Millisecond})
	f := newHTTPFixture(t, b, 4<<10, nil)
	peers := []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"}
	h := f.mw.Wrap(readAllHandler(f))
	f.dec.pressed.Store(true)
	for round := range 4 {
		for _, p := range peers {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, chunkedTraces(p, size))
			require.Equal(t, http.StatusOK, rec.Code, "round %d, peer %s", round, p)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, chunkedTraces("10.0.0.4:1", 1<<10))
		require.Equal(t, http.StatusOK, rec.Code, "a small request of another peer, round %d", round)
	}
	assert.EqualValues(t, 4*(3*size+1<<10), f.next.read.Load())
	assert.Zero(t, f.budget.Reserved())
}

// readAllHandler reads each body to its end, counting what it read in
// f.next, and answers 200, or 400 when the read fails.
func readAllHandler(f *httpFixture) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		f.next.read.Add(n)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
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
