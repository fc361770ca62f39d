// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

// End-to-end tests with real components: the real otlpreceiver
// with middlewares: [{id: throttle}] on its gRPC and HTTP servers, a started
// throttle extension whose state is driven through its resource source (the
// real sampler and state machines decide), and raw net/http and grpc-go
// clients. Helpers are in e2e_helpers_test.go; the tests with real OTLP
// exporters as clients are in the testbed module (testbed/test/exporters).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/otelthrottle/throttle/internal/decision"
)

const (
	pbType   = "application/x-protobuf"
	jsonType = "application/json"
)

// requireHTTPRejection checks the throttle's 429: Retry-After in the
// configured range, the Status body in the request's encoding, and
// Connection: close when open.
func requireHTTPRejection(t *testing.T, resp e2eResponse, contentType string, open bool) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "body: %s", resp.body)
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", resp.Header.Get("Retry-After"))
	assert.GreaterOrEqual(t, secs, int(e2eRetryLow/time.Second))
	assert.LessOrEqual(t, secs, int(e2eRetryHigh/time.Second))
	assert.Equal(t, contentType, resp.Header.Get("Content-Type"))
	st := &spb.Status{}
	if contentType == pbType {
		require.NoError(t, proto.Unmarshal(resp.body, st))
	} else {
		require.NoError(t, protojson.Unmarshal(resp.body, st))
	}
	assert.EqualValues(t, codes.ResourceExhausted, st.GetCode())
	assert.Contains(t, st.GetMessage(), "throttle")
	// net/http consumes the Connection header into resp.Close.
	assert.Equal(t, open, resp.Close, "Connection: close iff Open")
}

// requireGRPCRejection checks RESOURCE_EXHAUSTED with a RetryInfo detail in
// the configured range.
func requireGRPCRejection(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	st, ok := status.FromError(err)
	require.True(t, ok, "not a status error: %v", err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	require.NotNil(t, info, "no RetryInfo in %v", st.Details())
	d := info.GetRetryDelay().AsDuration()
	assert.GreaterOrEqual(t, d, e2eRetryLow)
	assert.LessOrEqual(t, d, e2eRetryHigh)
}

// TestE2EOpenRejectsHTTP: in Open every signal is rejected over HTTP, in
// both encodings, with the throttle's 429, also on paths that only
// clean to an OTLP route; nothing reaches the sinks and every rejection is
// counted.
func TestE2EOpenRejectsHTTP(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	c := e2eHTTPClient(t)

	want := map[decision.Signal]int64{}
	for _, s := range e2eSignals {
		pb, err := s.proto(5)
		require.NoError(t, err)
		js, err := s.json(5)
		require.NoError(t, err)
		for _, path := range []string{s.path, s.path + "/", "/" + s.path, s.path + "?x=1"} {
			requireHTTPRejection(t, env.post(t, c, path, pbType, pb), pbType, true)
			// Content-Type parameters and case do not change the encoding.
			requireHTTPRejection(t, env.post(t, c, path, "Application/X-Protobuf; charset=binary", pb), pbType, true)
			requireHTTPRejection(t, env.post(t, c, path, jsonType, js), jsonType, true)
			want[s.sig] += 3
		}
	}
	for _, s := range e2eSignals {
		assert.Zero(t, s.received(env), "%v reached the sink", s.sig)
		assert.Equal(t, want[s.sig], env.requests(t, "http", s.sig, "denied", "open"), "%v denied", s.sig)
		assert.Zero(t, env.requests(t, "http", s.sig, "allowed", ""), "%v allowed", s.sig)
	}
}

// TestE2EOpenRejectsGRPC: in Open every signal is rejected over gRPC with
// RESOURCE_EXHAUSTED + RetryInfo; nothing reaches the sinks and every
// rejection is counted.
func TestE2EOpenRejectsGRPC(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	const calls = 3
	for _, s := range e2eSignals {
		for range calls {
			requireGRPCRejection(t, s.grpcExport(ctx, cc, 5))
		}
	}
	for _, s := range e2eSignals {
		assert.Zero(t, s.received(env), "%v reached the sink", s.sig)
		assert.EqualValues(t, calls, env.requests(t, "grpc", s.sig, "denied", "open"), "%v denied", s.sig)
		assert.Zero(t, env.requests(t, "grpc", s.sig, "allowed", ""))
	}
}

// TestE2EExemptSignal: an exempt signal is admitted, over HTTP and gRPC,
// while the others are refused, until memory reaches its hard line: there
// the backstop refuses it too, so that a flood on it cannot meet the OOM
// killer.
func TestE2EExemptSignal(t *testing.T) {
	env := startE2E(t, e2eOptions{conf: map[string]any{
		"rules": map[string]any{
			"default": map[string]any{"drop_min": 1},
			"metrics": map[string]any{"enabled": false},
		},
	}})
	env.setLevel(t, e2eShedding, decision.StateShedding)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	c := e2eHTTPClient(t)
	cc := env.grpcConn(t)
	const perExport = 7
	metrics := e2eSignals[decision.SignalMetrics]
	require.Equal(t, decision.SignalMetrics, metrics.sig)
	pb, err := metrics.proto(perExport)
	require.NoError(t, err)
	resp := env.post(t, c, metrics.path, pbType, pb)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body: %s", resp.body)
	require.NoError(t, metrics.grpcExport(ctx, cc, perExport))
	for _, protocol := range []string{"http", "grpc"} {
		assert.EqualValues(t, 1, env.requests(t, protocol, decision.SignalMetrics, "allowed", ""), protocol)
		assert.Zero(t, env.requests(t, protocol, decision.SignalMetrics, "denied", "shed"), protocol)
	}
	assert.Equal(t, 2*perExport, env.metrics.DataPointCount())

	// The others are refused.
	for _, s := range e2eSignals {
		if s.sig == decision.SignalMetrics {
			continue
		}
		pb, err := s.proto(1)
		require.NoError(t, err)
		requireHTTPRejection(t, env.post(t, c, s.path, pbType, pb), pbType, false)
		requireGRPCRejection(t, s.grpcExport(ctx, cc, 1))
		assert.Zero(t, s.received(env))
	}

	// Memory at its hard line: the exempt signal is refused too.
	env.setLevel(t, e2eOpen, decision.StateOpen)
	for _, s := range e2eSignals {
		if s.sig != decision.SignalMetrics {
			continue
		}
		pb, err := s.proto(1)
		require.NoError(t, err)
		requireHTTPRejection(t, env.post(t, c, s.path, pbType, pb), pbType, true)
		requireGRPCRejection(t, s.grpcExport(ctx, cc, 1))
	}
	assert.Equal(t, 2*perExport, env.metrics.DataPointCount())
	assert.EqualValues(t, 1, env.requests(t, "http", decision.SignalMetrics, "denied", "open"))
	assert.EqualValues(t, 1, env.requests(t, "grpc", decision.SignalMetrics, "denied", "open"))
}

// TestE2ESheddingRejectsAboutPDrop: half way between enter (0.5) and hard
// (0.9) with drop_min 0 and drop_max 1, p_drop is 0.5. Of N requests the
// rejected count is Binomial(N, 0.5); the test allows 5 standard deviations
// (a false failure about once in 1.7 million runs). Admitted requests are
// delivered exactly, and shed ones keep their connection.
func TestE2ESheddingRejectsAboutPDrop(t *testing.T) {
	const (
		n     = 400
		pDrop = 0.5
	)
	tolerance := 5 * math.Sqrt(n*pDrop*(1-pDrop))
	checkShare := func(t *testing.T, rejected int) {
		t.Logf("rejected %d of %d (expected %.0f ± %.0f)", rejected, n, n*pDrop, tolerance)
		assert.InDelta(t, n*pDrop, float64(rejected), tolerance)
	}

	t.Run("http", func(t *testing.T) {
		env := startE2E(t, e2eOptions{})
		env.setLevel(t, e2eShedding, decision.StateShedding)
		c := e2eHTTPClient(t)
		body, err := e2eSignals[0].proto(1)
		require.NoError(t, err)
		rejected := 0
		for range n {
			resp := env.post(t, c, "/v1/traces", pbType, body)
			if resp.StatusCode == http.StatusTooManyRequests {
				rejected++
				requireHTTPRejection(t, resp, pbType, false)
			} else {
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
		}
		checkShare(t, rejected)
		assert.Equal(t, n-rejected, env.traces.SpanCount())
		assert.EqualValues(t, rejected, env.requests(t, "http", decision.SignalTraces, "denied", "shed"))
		assert.EqualValues(t, n-rejected, env.requests(t, "http", decision.SignalTraces, "allowed", ""))
	})

	t.Run("grpc", func(t *testing.T) {
		env := startE2E(t, e2eOptions{})
		env.setLevel(t, e2eShedding, decision.StateShedding)
		cc := env.grpcConn(t)
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		defer cancel()
		rejected := 0
		for range n {
			if err := e2eSignals[2].grpcExport(ctx, cc, 1); err != nil {
				rejected++
				requireGRPCRejection(t, err)
			}
		}
		checkShare(t, rejected)
		assert.Equal(t, n-rejected, env.logs.LogRecordCount())
		assert.EqualValues(t, rejected, env.requests(t, "grpc", decision.SignalLogs, "denied", "shed"))
		assert.EqualValues(t, n-rejected, env.requests(t, "grpc", decision.SignalLogs, "allowed", ""))
	})
}

// TestE2EUnknownPathsNeverRejected: requests the classifier does not know
// (a health probe, an unknown path, an unknown gRPC service) go to the
// receiver even in Open, which answers them itself, and are not counted.
func TestE2EUnknownPathsNeverRejected(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	c := e2eHTTPClient(t)
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/healthz"},
		{http.MethodGet, "/"},
		{http.MethodPost, "/v1/unknown"},
		{http.MethodPost, "/v1/traces/extra"},
		{http.MethodPost, "/api/v2/spans"}, // not configured in routes.http
	} {
		req, err := http.NewRequest(tc.method, "http://"+env.httpAddr+tc.path, bytes.NewReader([]byte("{}")))
		require.NoError(t, err)
		req.Header.Set("Content-Type", jsonType)
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s", tc.method, tc.path)
		assert.Empty(t, resp.Header.Get("Retry-After"), "%s %s", tc.method, tc.path)
	}

	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	err := cc.Invoke(ctx, "/grpc.health.v1.Health/Check", &emptypb.Empty{}, &emptypb.Empty{})
	assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)

	for _, s := range e2eSignals {
		for _, protocol := range []string{"http", "grpc"} {
			assert.Zero(t, env.requests(t, protocol, s.sig, "denied", "open"))
			assert.Zero(t, env.requests(t, protocol, s.sig, "allowed", ""))
		}
	}
}

// e2eFailingBody fails the test when it is read.
type e2eFailingBody struct {
	t    *testing.T
	read atomic.Bool
}

func (b *e2eFailingBody) Read([]byte) (int, error) {
	b.read.Store(true)
	b.t.Error("the request body was read")
	return 0, errors.New("the body must not be read")
}

func (*e2eFailingBody) Close() error { return nil }

// e2eCountingBody counts what is read of it.
type e2eCountingBody struct {
	r io.Reader
	n atomic.Int64
}

func (b *e2eCountingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func (*e2eCountingBody) Close() error { return nil }

// TestE2ERejectedBodyNeverSent: a client that sends Expect: 100-continue
// (curl does for large bodies) is answered 429 by the real receiver without
// ever being asked for its body, which fails the test if read. The Normal
// case shows the check is not vacuous: there the receiver asks for the body
// and decodes it.
func TestE2ERejectedBodyNeverSent(t *testing.T) {
	env := startE2E(t, e2eOptions{})
	c := e2eHTTPClient(t)
	send := func(body io.ReadCloser, size int64) *http.Response {
		req, err := http.NewRequest(http.MethodPost, "http://"+env.httpAddr+"/v1/traces", body)
		require.NoError(t, err)
		req.ContentLength = size
		req.Header.Set("Content-Type", pbType)
		req.Header.Set("Expect", "100-continue")
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}

	payload, err := e2eSignals[0].proto(50)
	require.NoError(t, err)
	ok := &e2eCountingBody{r: bytes.NewReader(payload)}
	assert.Equal(t, http.StatusOK, send(ok, int64(len(payload))).StatusCode)
	assert.EqualValues(t, len(payload), ok.n.Load())
	assert.Equal(t, 50, env.traces.SpanCount())

	env.setLevel(t, e2eOpen, decision.StateOpen)
	fb := &e2eFailingBody{t: t}
	resp := send(fb, 4<<20)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.False(t, fb.read.Load())
	assert.Equal(t, 50, env.traces.SpanCount())
}

// e2eCountingProxy forwards one TCP connection to target and counts the
// bytes it hands to the server's socket. Its upstream send buffer is small
// and fixed, so what it counts is what the server read plus at most the two
// kernel buffers in between (a fixed ~64 KiB send buffer here, the server's
// receive buffer, which does not grow while the server is not reading).
type e2eCountingProxy struct {
	ln        net.Listener
	forwarded atomic.Int64
	done      chan struct{}
}

func startE2ECountingProxy(t *testing.T, target string) *e2eCountingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &e2eCountingProxy{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		down, err := ln.Accept()
		if err != nil {
			return
		}
		defer down.Close()
		up, err := net.Dial("tcp", target)
		if err != nil {
			t.Errorf("proxy dial: %v", err)
			return
		}
		defer up.Close()
		// A fixed send buffer (no autotuning) bounds what waits in it.
		if err := up.(*net.TCPConn).SetWriteBuffer(32 << 10); err != nil {
			t.Errorf("proxy: %v", err)
			return
		}

		var wg sync.WaitGroup
		// Server to client: the response, then a half close so that the
		// client reads it in full.
		wg.Go(func() {
			_, _ = io.Copy(down, up)
			_ = down.(*net.TCPConn).CloseWrite()
		})
		// Client to server, counting. Once the server has closed, keep
		// draining the client rather than resetting its connection before
		// it has read the response.
		buf := make([]byte, 32<<10)
		upOpen := true
		for {
			n, rerr := down.Read(buf)
			if n > 0 && upOpen {
				w, werr := up.Write(buf[:n])
				p.forwarded.Add(int64(w))
				if werr != nil {
					upOpen = false
					_ = up.Close()
				}
			}
			if rerr != nil {
				break
			}
		}
		_ = up.Close()
		wg.Wait()
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-p.done
	})
	return p
}

// forwardedOfRejected sends a body of bodySize to the real receiver in
// Open through a proxy that counts what it hands to the server, checks the
// answer is a rejection, and returns the count.
func forwardedOfRejected(t *testing.T, bodySize int) int64 {
	t.Helper()
	env := startE2E(t, e2eOptions{})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	p := startE2ECountingProxy(t, env.httpAddr)

	conn, err := net.Dial("tcp", p.ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	head := fmt.Sprintf("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", pbType, bodySize)
	// The body is written from another goroutine: it blocks once the
	// buffers are full, and fails or finishes when the connection closes.
	writeDone := make(chan struct{})
	go func() {
		defer close(writeDone)
		_, _ = conn.Write(append([]byte(head), make([]byte, bodySize)...))
	}()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(e2eWait)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	requireHTTPRejection(t, e2eResponse{Response: resp, body: b}, pbType, true)
	require.NoError(t, conn.Close())
	<-writeDone
	require.NoError(t, p.ln.Close())
	<-p.done

	assert.EqualValues(t, 1, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
	assert.Zero(t, env.traces.SpanCount())
	fwd := p.forwarded.Load()
	t.Logf("handed %d bytes of a %d byte request to the server's socket", fwd, len(head)+bodySize)
	return fwd
}

// TestE2ERejectedBodyServerBytes sends a 4 MiB body to the real receiver in
// Open: far less than the body gets past the kernel buffers, because the
// throttle answers before anything reads the body and then closes the
// connection.
func TestE2ERejectedBodyServerBytes(t *testing.T) {
	// The headers and the kernel buffers (tens to a few hundred KiB) vs
	// 4 MiB: a server that read the body would take all of it.
	assert.Less(t, forwardedOfRejected(t, 4<<20), int64(1<<20))
}

// TestE2ERejectedBodyUnder256KiBNotRead: net/http itself reads and discards
// up to 256 KiB of a body a handler left unread, even after an answer with
// "Connection: close". Through the real receiver (confighttp's handler
// chain, otelhttp's response writer) a rejection of a body just under that
// closes the connection without reading it: what reaches the server's
// socket stays below the body, where a read would take all of it.
func TestE2ERejectedBodyUnder256KiBNotRead(t *testing.T) {
	const bodySize = 250 << 10
	assert.Less(t, forwardedOfRejected(t, bodySize), int64(bodySize))
}

// TestE2EPacedShedding: with the tarpit on, a shed request through the real
// otlpreceiver (confighttp's handler chain around the middleware) is
// answered 429 only after the tarpit delay and keeps its connection (its
// body was read, so the next request reuses it); an Open rejection is not
// held, which the second part shows with the longest delay allowed. In the
// first part the delay is a lower bound only.
func TestE2EPacedShedding(t *testing.T) {
	start := func(t *testing.T, delay time.Duration) *e2eEnv {
		env := startE2E(t, e2eOptions{conf: map[string]any{
			"tarpit": map[string]any{"delay": delay.String(), "max_requests": 4},
			"rules":  map[string]any{"default": map[string]any{"drop_min": 1.0, "drop_max": 1.0}},
		}})
		env.setLevel(t, e2eShedding, decision.StateShedding)
		return env
	}
	body, err := e2eSignals[0].proto(200) // about 40 KiB
	require.NoError(t, err)

	t.Run("shed is held, connection kept", func(t *testing.T) {
		const delay = 300 * time.Millisecond
		env := start(t, delay)
		c := e2eHTTPClient(t)
		var reused []bool
		for range 2 {
			req, err := http.NewRequest(http.MethodPost, "http://"+env.httpAddr+"/v1/traces", bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", pbType)
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) { reused = append(reused, info.Reused) },
			}))
			began := time.Now()
			resp, err := c.Do(req)
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			elapsed := time.Since(began)
			requireHTTPRejection(t, e2eResponse{Response: resp, body: b}, pbType, false)
			assert.GreaterOrEqual(t, elapsed, delay, "answered before the tarpit delay")
		}
		assert.Equal(t, []bool{false, true}, reused, "the paced rejection kept its connection")
		assert.EqualValues(t, 2, env.requests(t, "http", decision.SignalTraces, "denied", "shed"))
		assert.Zero(t, env.traces.SpanCount())
	})

	t.Run("Open is not held", func(t *testing.T) {
		const delay = 10 * time.Second // the longest allowed
		env := start(t, delay)
		env.setLevel(t, e2eOpen, decision.StateOpen)
		began := time.Now()
		resp := env.post(t, e2eHTTPClient(t), "/v1/traces", pbType, body)
		requireHTTPRejection(t, resp, pbType, true)
		assert.Less(t, time.Since(began), delay, "an Open rejection was held")
	})
}

// TestE2EQueueHoldsUntilAdmitted: with holding on, an HTTP request that
// arrives in Open is held through the real otlpreceiver, its body unread
// (nothing reaches the pipeline), and delivered as soon as the state lets
// it in; one held past max_wait gets its 429 then.
func TestE2EQueueHoldsUntilAdmitted(t *testing.T) {
	env := startE2E(t, e2eOptions{conf: map[string]any{"hold": map[string]any{"max_wait": "20s", "max_requests": 8}}})
	e := env.ext.(*throttleExtension)
	env.setLevel(t, e2eOpen, decision.StateOpen)
	c := e2eHTTPClient(t)
	pb, err := e2eSignals[0].proto(5)
	require.NoError(t, err)
	type result struct {
		resp e2eResponse
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := env.tryPost(c, e2eSignals[0].path, pbType, pb)
		got <- result{resp, err}
	}()
	require.Eventually(t, func() bool { return e.runner.MiddlewareConfig().Admission.Stats().HeldRequests == 1 }, e2eWait, time.Millisecond, "held")
	assert.Zero(t, e2eSignals[0].received(env), "a held body is not read")
	env.setLevel(t, e2eCalm, decision.StateNormal)
	select {
	case r := <-got:
		require.NoError(t, r.err)
		assert.Equal(t, http.StatusOK, r.resp.StatusCode, "body: %s", r.resp.body)
	case <-time.After(e2eWait):
		t.Fatal("the held request was not admitted")
	}
	assert.Equal(t, 5, e2eSignals[0].received(env))
	assert.Zero(t, e.runner.MiddlewareConfig().Admission.Stats().HeldRequests)
	assert.EqualValues(t, 1, env.requests(t, "http", decision.SignalTraces, "allowed", ""))
	assert.Zero(t, env.requests(t, "http", decision.SignalTraces, "denied", "open"), "a held request that got in is no denial")
}

func TestE2EQueueRefusesAfterMaxWait(t *testing.T) {
	const maxWait = 300 * time.Millisecond
	env := startE2E(t, e2eOptions{conf: map[string]any{"hold": map[string]any{"max_wait": maxWait.String(), "max_requests": 8}}})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	c := e2eHTTPClient(t)
	pb, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	start := time.Now()
	requireHTTPRejection(t, env.post(t, c, e2eSignals[0].path, pbType, pb), pbType, true)
	assert.GreaterOrEqual(t, time.Since(start), maxWait)
	assert.Zero(t, e2eSignals[0].received(env))
	assert.EqualValues(t, 1, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
}

// TestE2EObserveOnly: with observe_only, every decision is made and counted
// but nothing is refused: in Open every signal is delivered over HTTP and
// gRPC, and throttle_requests counts the denials that would have been as
// would_deny, none as denied.
func TestE2EObserveOnly(t *testing.T) {
	env := startE2E(t, e2eOptions{conf: map[string]any{"observe_only": true}})
	env.setLevel(t, e2eOpen, decision.StateOpen)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	c := e2eHTTPClient(t)
	cc := env.grpcConn(t)
	for _, s := range e2eSignals {
		pb, err := s.proto(2)
		require.NoError(t, err)
		resp := env.post(t, c, s.path, pbType, pb)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v: %s", s.sig, resp.body)
		require.NoError(t, s.grpcExport(ctx, cc, 2))
		assert.Equal(t, 4, s.received(env), "%v", s.sig)
		assert.EqualValues(t, 1, env.requests(t, "http", s.sig, "would_deny", "open"), "%v", s.sig)
		assert.EqualValues(t, 1, env.requests(t, "grpc", s.sig, "would_deny", "open"), "%v", s.sig)
		assert.Zero(t, env.requests(t, "http", s.sig, "denied", "open"), "%v", s.sig)
		assert.Zero(t, env.requests(t, "grpc", s.sig, "denied", "open"), "%v", s.sig)
	}
}
