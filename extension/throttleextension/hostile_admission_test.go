// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

// Hostile and odd clients against the admission budget: it must not be
// held by slow or silent clients, poisoned by small requests, or wasted on
// bodies cut off mid-read. Through the real otlpreceiver, as the other
// hostile tests (hostile_test.go, helpers in e2e_helpers_test.go).

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
)

// hostileGate is a traces consumer that holds every export while closed,
// so that admitted requests keep their reservations as long as the test
// needs.
type hostileGate struct {
	consumertest.TracesSink
	mu      sync.Mutex
	ch      chan struct{}
	entered atomic.Int64
}

func (g *hostileGate) ConsumeTraces(ctx context.Context, td ptrace.Traces) error {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		g.entered.Add(1)
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.TracesSink.ConsumeTraces(ctx, td)
}

// hold closes the gate until release, or the end of the test.
func (g *hostileGate) hold(t *testing.T) {
	g.mu.Lock()
	g.ch = make(chan struct{})
	g.mu.Unlock()
	t.Cleanup(g.release)
}

func (g *hostileGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

// hostileSlowBody opens a connection that sends the head of a traces
// request announcing size bytes and the first `first` of them, then one
// byte every `every` (never when 0) until the returned stop is called.
func hostileSlowBody(t *testing.T, addr string, size, first int, every time.Duration) (net.Conn, func()) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, e2eWait)
	require.NoError(t, err)
	require.NoError(t, conn.SetDeadline(time.Now().Add(e2eWait)))
	head := hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1", "Host: x", "Content-Type: "+pbType, "Content-Length: "+strconv.Itoa(size))
	_, err = conn.Write(append(head, make([]byte, first)...))
	require.NoError(t, err)
	done := make(chan struct{})
	var wg sync.WaitGroup
	if every > 0 {
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
					if _, err := conn.Write([]byte{0}); err != nil {
						return
					}
				}
			}
		})
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(done)
			conn.Close()
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return conn, stop
}

// TestHostileSlowHTTPBodies: two clients announce half the admission
// budget each and then send their bodies a byte at a time; a third sends
// part of its body and then nothing. Each holds only the first reservation
// of a traces body (unknown_size), not what it announces, so an ordinary
// request is still delivered; a byte now and then is no progress, so all
// three are cut off once they have not sent 64 KiB within idle_timeout,
// with a retryable 429 + Retry-After naming the rate they fell short of (a
// 400 the OTLP exporters would drop), without any timeout configured on the
// receiver; their reservations return.
func TestHostileSlowHTTPBodies(t *testing.T) {
	conf := hostileBudgetConf()
	conf["admission"].(map[string]any)["idle_timeout"] = "2s"
	env := startE2E(t, e2eOptions{conf: conf})
	slow1, stop1 := hostileSlowBody(t, env.httpAddr, hostileBudget/2, 1, 200*time.Millisecond)
	slow2, stop2 := hostileSlowBody(t, env.httpAddr, hostileBudget/2, 1, 200*time.Millisecond)
	defer stop1()
	defer stop2()
	require.Eventually(t, func() bool {
		return env.requests(t, "http", decision.SignalTraces, "allowed", "") == 2 && hostileReserved(env) == 2*hostileUnknown
	}, e2eWait, time.Millisecond, "the slow bodies do not hold their first reservation only")

	body, spans := hostileTraces(t, hostileBudget/4)
	r := hostileRaw(t, env.httpAddr, append(hostileHead(http.MethodPost, "/v1/traces", "HTTP/1.1",
		"Host: x", "Content-Type: "+pbType, "Content-Length: "+strconv.Itoa(len(body))), body...), false)
	require.Equal(t, http.StatusOK, r.StatusCode, "%q", r.body)
	assert.Equal(t, spans, env.traces.SpanCount())

	silent, _ := hostileSlowBody(t, env.httpAddr, hostileBudget/2, 100, 0)
	for name, conn := range map[string]net.Conn{"silent": silent, "slow": slow1, "slower": slow2} {
		resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodPost})
		require.NoError(t, err, "the %s body was never cut off", name)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, name)
		assert.NotEmpty(t, resp.Header.Get("Retry-After"), name)
		assert.Contains(t, string(b), "request body slower than 64 KiB per 2s", name)
	}
	require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond,
		"the cut bodies' reservations were not released")
	assert.Equal(t, spans, env.traces.SpanCount())
	// Counted allowed when let in, so the cut-offs are counted apart.
	assert.EqualValues(t, 3, e2edata.CutOffs(t, env.tel, "http", "traces", "slow"))
	assert.EqualValues(t, 4, env.requests(t, "http", decision.SignalTraces, "allowed", ""))
}

// hostileDialFrom returns a dialer whose connections come from the
// loopback address local (Linux routes all of 127/8 to lo).
func hostileDialFrom(local string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return d.DialContext
}

// TestHostileGRPCSilentStreams: 50 streams on one connection that send
// their headers and never a message, at the default share: a gRPC call
// holds what its message may decode to (grpc_max_message_size, at most a
// quarter of the budget) from before the message is read, so two streams
// hold the client address's half of the budget and every other one is refused
// at once (wait_timeout 0) before any authentication could run, with
// RESOURCE_EXHAUSTED + RetryInfo at the tap or, let in by the tap and
// refused before its message is read, cancelled. Clients at other
// addresses are still admitted over gRPC and HTTP. The admitted silent
// streams are cancelled by the server after six idle timeouts, which
// releases their reservations without the client doing anything.
func TestHostileGRPCSilentStreams(t *testing.T) {
	e2eskip.Slow(t, "waits for the server to cancel the silent streams, six idle timeouts (18 s)")
	const idle = 3 * time.Second
	env := startE2E(t, e2eOptions{conf: map[string]any{
		// Long enough for the checks below to run while the streams are
		// still open on a loaded machine.
		"admission": map[string]any{
			"max_inflight_bytes": hostileBudget, "unknown_size": hostileUnknown, "idle_timeout": idle.String(), "wait_timeout": "0s",
		},
	}})
	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()

	const streams, fit = 50, 2
	start := time.Now()
	errs := make(chan error, streams)
	var wg sync.WaitGroup
	for range streams {
		cs, err := hostileSilentStream(ctx, cc, hostileTracesMethod)
		require.NoError(t, err)
		wg.Go(func() { errs <- cs.RecvMsg(&emptypb.Empty{}) })
	}
	require.Eventually(t, func() bool {
		return env.requests(t, "grpc", decision.SignalTraces, "denied", "budget") == streams-fit &&
			env.requests(t, "grpc", decision.SignalTraces, "allowed", "") == fit
	}, e2eWait, time.Millisecond, "not every stream was decided as expected")
	assert.EqualValues(t, hostileBudget/2, hostileReserved(env), "one address holds half the budget")

	// Other addresses: the first that is admitted shows the budget was not
	// held (three, in case the key table puts one in 127.0.0.1's slot).
	body, spans := hostileTraces(t, 1<<10)
	admitted := false
	for _, local := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		other, err := grpc.NewClient(env.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return hostileDialFrom(local)(ctx, "tcp", addr)
			}))
		require.NoError(t, err)
		err = e2eSignals[0].grpcExport(ctx, other, 2)
		require.NoError(t, other.Close())
		if err != nil {
			requireGRPCRejection(t, err)
			continue
		}
		tr := &http.Transport{DialContext: hostileDialFrom(local)}
		resp := env.post(t, &http.Client{Transport: tr, Timeout: e2eWait}, "/v1/traces", pbType, body)
		tr.CloseIdleConnections()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", resp.body)
		admitted = true
		break
	}
	require.True(t, admitted, "no other address was admitted next to the silent streams")
	assert.Equal(t, 2+spans, env.traces.SpanCount())

	// The refused streams ended at once, the admitted ones when the server
	// cancelled them.
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
	for range fit {
		assert.Equal(t, codes.Canceled, status.Code(<-errs), "an admitted silent stream is cancelled by the server")
	}
	assert.GreaterOrEqual(t, time.Since(start), 6*idle, "cancelled before six idle timeouts")
	wg.Wait()
	require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond)
}

// TestHostileCompressedBurst: 30 concurrent gzip requests of one size
// against a budget that holds ten and a half of them. confighttp drops the
// length of a compressed body, so the throttle cannot know it; once one
// such body has been read, the next ones reserve what traces bodies
// decompress to when their first byte arrives. Ten are admitted and
// delivered; the others are refused with 429 + Retry-After 1, nearly all
// before anything is decompressed (at admission or at their first byte).
// The first reservation is capped at what its key has left, so at most one
// is admitted with the last half share and cut off after waiting
// wait_timeout for the rest; nothing is lost and the budget is never
// exceeded.
func TestHostileCompressedBurst(t *testing.T) {
	plain, spans := hostileTraces(t, 64<<10)
	gz := hostileGzip(t, plain)
	const fit, burst = 10, 30
	gate := &hostileGate{}
	env := startE2E(t, e2eOptions{traces: gate, conf: map[string]any{
		"admission": map[string]any{
			"max_inflight_bytes": fit*len(plain) + len(plain)/2,
			"unknown_size":       hostileUnknown,
			"fairness":           map[string]any{"share": 1},
		},
	}})
	c := e2eHTTPClient(t)
	post := func() (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+env.httpAddr+"/v1/traces", bytes.NewReader(gz))
		if err != nil {
			return 0, err.Error()
		}
		req.Header.Set("Content-Type", pbType)
		req.Header.Set("Content-Encoding", "gzip")
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	code, _ := post()
	require.Equal(t, http.StatusOK, code, "the first body, which teaches the size")

	gate.hold(t)
	type answer struct {
		code       int
		retryAfter string
	}
	answers := make(chan answer, burst)
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			code, ra := post()
			answers <- answer{code, ra}
		})
	}
	// Every request of the burst decided (the first one's included), and
	// any admitted beyond fit cut off.
	cutOff := func() int64 { return env.requests(t, "http", decision.SignalTraces, "allowed", "") - 1 - fit }
	if !assert.Eventually(t, func() bool {
		return gate.entered.Load() == fit && cutOff()+env.requests(t, "http", decision.SignalTraces, "denied", "budget") == burst-fit &&
			len(answers) == burst-fit
	}, e2eWait, time.Millisecond) {
		t.Fatalf("admitted %d, delivering %d, refused %d of %d", cutOff()+fit,
			gate.entered.Load(), env.requests(t, "http", decision.SignalTraces, "denied", "budget"), burst)
	}
	t.Logf("refused before their body: %d, admitted and cut off: %d", env.requests(t, "http", decision.SignalTraces, "denied", "budget"), cutOff())
	assert.LessOrEqual(t, cutOff(), int64(1), "more than one body admitted beyond fit")
	assert.LessOrEqual(t, hostileHighWater(t, env).Load(), int64(fit*len(plain)+len(plain)/2))
	gate.release()
	wg.Wait()
	close(answers)
	var ok, refused int
	for a := range answers {
		switch a.code {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			assert.Equal(t, "1", a.retryAfter)
			refused++
		default:
			t.Errorf("unexpected answer %d %q", a.code, a.retryAfter)
		}
	}
	assert.Equal(t, fit, ok)
	assert.Equal(t, burst-fit, refused)
	assert.Equal(t, (1+fit)*spans, gate.SpanCount(), "every admitted body was delivered")
	require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond)
}

// TestHostileGRPCEstimateNotPoisoned: after one large traces export, a
// hundred nearly empty ones do not lower what the next traces RPC
// reserves, and while a large export is handled the budget shows it and
// refuses another RPC that would not fit beside it. (A running average
// fell to one byte and no longer bounded anything.)
func TestHostileGRPCEstimateNotPoisoned(t *testing.T) {
	plain, spans := hostileTraces(t, 200<<10)
	gate := &hostileGate{}
	env := startE2E(t, e2eOptions{traces: gate, conf: map[string]any{
		"admission": map[string]any{"max_inflight_bytes": 320 << 10, "unknown_size": hostileUnknown, "fairness": map[string]any{"share": 1}},
	}})
	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	// One at a time: an RPC's reservation is released after its client
	// has the answer, and two large estimates do not fit in the budget.
	export := func(n int) {
		t.Helper()
		require.NoError(t, e2eSignals[0].grpcExport(ctx, cc, n))
		require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond)
	}
	export(spans)
	for range 100 {
		export(0)
	}

	gate.hold(t)
	bigErr := make(chan error, 1)
	go func() { bigErr <- e2eSignals[0].grpcExport(ctx, cc, spans) }()
	require.Eventually(t, func() bool { return gate.entered.Load() == 1 }, e2eWait, time.Millisecond)
	assert.GreaterOrEqual(t, hostileReserved(env), int64(len(plain)), "the large export being handled is not in the budget")
	requireGRPCRejection(t, e2eSignals[0].grpcExport(ctx, cc, 1))
	assert.EqualValues(t, 1, env.requests(t, "grpc", decision.SignalTraces, "denied", "budget"))
	gate.release()
	require.NoError(t, <-bigErr)
	require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond)
	assert.Equal(t, 2*spans, gate.SpanCount())
}

// TestHostileShutdownBounded: the service calls the extension's NotReady
// before it shuts the receivers down, and the receivers' servers wait for
// the requests in flight. A client trickling its HTTP body (a byte every
// 100 ms, which is no progress, at the longest idle_timeout) and a gRPC call
// and an HTTP request held in the hold (max_wait at its longest, the call's
// deadline five minutes away) cannot delay that: NotReady and the
// receivers' Shutdown take less than five seconds, the held requests are
// refused at once and the trickling body is cut off after a second, each
// with an answer the OTLP exporters retry.
func TestHostileShutdownBounded(t *testing.T) {
	env := startE2E(t, e2eOptions{conf: map[string]any{
		"admission": map[string]any{"idle_timeout": "1m"},
		"hold":      map[string]any{"max_wait": "30s", "max_requests": 8},
	}})
	e, ok := env.ext.(*throttleExtension)
	require.True(t, ok)

	// Admitted in Normal; its first byte holds a reservation.
	trickle, _ := hostileSlowBody(t, env.httpAddr, 1<<20, 1, 100*time.Millisecond)
	require.Eventually(t, func() bool { return env.requests(t, "http", decision.SignalTraces, "allowed", "") == 1 },
		e2eWait, time.Millisecond, "the trickling body was not admitted")

	env.setLevel(t, e2eOpen, decision.StateOpen)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cc := env.grpcConn(t)
	grpcErr := make(chan error, 1)
	go func() { grpcErr <- e2eSignals[0].grpcExport(ctx, cc, 1) }()
	type result struct {
		resp e2eResponse
		err  error
	}
	held := make(chan result, 1)
	body, err := e2eSignals[0].proto(1)
	require.NoError(t, err)
	go func() {
		resp, err := env.tryPost(e2eHTTPClient(t), "/v1/traces", pbType, body)
		held <- result{resp, err}
	}()
	require.Eventually(t, func() bool { return e.runner.MiddlewareConfig().Admission.Stats().HeldRequests == 2 }, e2eWait, time.Millisecond,
		"the gRPC call and the HTTP request are not held")

	start := time.Now()
	require.NoError(t, e.NotReady())
	for _, r := range env.receivers {
		require.NoError(t, r.Shutdown(context.Background()))
	}
	elapsed := time.Since(start)
	t.Logf("NotReady and the receivers' Shutdown took %v", elapsed)
	assert.Less(t, elapsed, 5*time.Second, "the clients delayed the shutdown")

	// The trickling body: cut off with a retryable 429.
	require.NoError(t, trickle.SetReadDeadline(time.Now().Add(e2eWait)))
	resp, err := http.ReadResponse(bufio.NewReader(trickle), &http.Request{Method: http.MethodPost})
	require.NoError(t, err, "the trickling body got no answer")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))

	// The held gRPC call: refused with a code the exporters retry.
	err = <-grpcErr
	t.Logf("held gRPC call: %v", err)
	switch status.Code(err) {
	case codes.ResourceExhausted:
		requireGRPCRejection(t, err)
	case codes.Canceled, codes.Unavailable:
	default:
		t.Errorf("the held gRPC call ended with %v, which the exporters do not retry", err)
	}

	// The held HTTP request: refused as in Open.
	r := <-held
	require.NoError(t, r.err)
	requireHTTPRejection(t, r.resp, pbType, true)
	assert.EqualValues(t, 1, env.requests(t, "http", decision.SignalTraces, "denied", "open"))
	assert.EqualValues(t, 1, env.requests(t, "grpc", decision.SignalTraces, "denied", "open"))
	assert.Zero(t, env.traces.SpanCount())
}

// TestHostileGRPCSilentStreamsTwoAddresses: two addresses each open two
// gRPC streams that send their headers and never a message. Each holds what
// its message may decode to, a quarter of the budget, so together they hold
// all of it; a client at a third address sending small batches over HTTP
// and gRPC, retrying after each refusal as the exporters do, gets its data
// in within a few seconds (the silent streams of keys above their fair
// share are cut off after 2 s while others are refused) rather than waiting
// for them to be cancelled after six idle timeouts.
func TestHostileGRPCSilentStreamsTwoAddresses(t *testing.T) {
	env := startE2E(t, e2eOptions{conf: map[string]any{
		"admission": map[string]any{"max_inflight_bytes": hostileBudget, "unknown_size": hostileUnknown},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	dial := func(local string) *grpc.ClientConn {
		cc, err := grpc.NewClient(env.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return hostileDialFrom(local)(ctx, "tcp", addr)
			}))
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, cc.Close()) })
		return cc
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	// Two streams per address: each holds what its message may decode to,
	// a quarter of the budget, and each address may hold half of it alone.
	for _, local := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"} {
		cs, err := hostileSilentStream(sctx, dial(local), hostileTracesMethod)
		require.NoError(t, err)
		wg.Go(func() { _ = cs.RecvMsg(&emptypb.Empty{}) })
	}
	require.Eventually(t, func() bool { return hostileReserved(env) == hostileBudget }, e2eWait, time.Millisecond,
		"the silent streams do not hold the budget")

	honest := dial("127.0.0.1")
	body, _ := hostileTraces(t, 1<<10)
	c := e2eHTTPClient(t)
	deadline := time.Now().Add(5 * time.Second)
	var httpOK, grpcOK bool
	for (!httpOK || !grpcOK) && time.Now().Before(deadline) {
		if !httpOK {
			httpOK = env.post(t, c, "/v1/traces", pbType, body).StatusCode == http.StatusOK
		}
		if !grpcOK {
			grpcOK = e2eSignals[0].grpcExport(ctx, honest, 1) == nil
		}
		time.Sleep(time.Second) // the refusals' Retry-After
	}
	assert.True(t, httpOK, "the honest HTTP client got nothing in for 5 s (reserved %d of %d)", hostileReserved(env), hostileBudget)
	assert.True(t, grpcOK, "the honest gRPC client got nothing in for 5 s")
}
