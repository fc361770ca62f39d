// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

// Hostile and odd clients against the admission budget (issue 13): it must
// not be held by slow or silent clients, poisoned by small requests, or
// wasted on bodies cut off mid-read. Through the real otlpreceiver, as the
// other hostile tests (hostile_test.go, helpers in e2e_helpers_test.go).

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
// part of its body and then nothing. The slow ones hold only the first
// reservation of a traces body (unknown_size), not what they announce, so
// an ordinary request is still delivered; a byte now and then is no
// progress (issue 28 point 1), so all three are cut off once they have not
// sent 64 KiB within idle_timeout, with a retryable 429 + Retry-After (a
// 400 the OTLP exporters would drop, point 6), without any timeout
// configured on the receiver; their reservations return.
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
}

// hostileDialFrom returns a dialer whose connections come from the
// loopback address local (Linux routes all of 127/8 to lo).
func hostileDialFrom(local string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return d.DialContext
}

// TestHostileGRPCSilentStreams: 50 streams on one connection that send
// their headers and never a message, at the default peer_share: the
// client's address gets half the budget (two unknown_size reservations),
// every other stream is refused RESOURCE_EXHAUSTED before any
// authentication could run, and clients at other addresses are still
// admitted over gRPC and HTTP. The admitted silent streams are cancelled
// by the server after six idle timeouts, which releases their reservations
// without the client doing anything.
func TestHostileGRPCSilentStreams(t *testing.T) {
	e2eskip.Slow(t, "waits for the server to cancel the silent streams, six idle timeouts (18 s)")
	env := startE2E(t, e2eOptions{conf: map[string]any{
		// Long enough for the checks below to run while the streams are
		// still open on a loaded machine.
		"admission": map[string]any{"max_inflight_bytes": hostileBudget, "unknown_size": hostileUnknown, "idle_timeout": "3s"},
	}})
	cc := env.grpcConn(t)
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()

	const streams, fit = 50, hostileBudget / 2 / hostileUnknown
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
	// held (three, in case the per-peer hash puts one next to 127.0.0.1).
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

	wg.Wait()
	close(errs)
	var cancelled, refused int
	for err := range errs {
		switch status.Code(err) {
		case codes.Canceled:
			cancelled++
		case codes.ResourceExhausted:
			requireGRPCRejection(t, err)
			refused++
		default:
			t.Errorf("unexpected %v", err)
		}
	}
	assert.Equal(t, fit, cancelled, "the admitted silent streams are cancelled by the server")
	assert.Equal(t, streams-fit, refused)
	require.Eventually(t, func() bool { return hostileReserved(env) == 0 }, e2eWait, time.Millisecond)
}

// TestHostileCompressedBurst: 30 concurrent gzip requests of one size
// against a budget that holds ten of them. confighttp drops the length of a
// compressed body, so the throttle cannot know it; once one such body has
// been read, the next ones reserve what traces bodies decompress to. Ten
// are admitted and delivered, twenty are refused at once with 429 +
// Retry-After before anything is decompressed, and none is cut off
// mid-read (which would throw away its decompression and be sent again).
func TestHostileCompressedBurst(t *testing.T) {
	plain, spans := hostileTraces(t, 64<<10)
	gz := hostileGzip(t, plain)
	const fit, burst = 10, 30
	gate := &hostileGate{}
	env := startE2E(t, e2eOptions{traces: gate, conf: map[string]any{
		"admission": map[string]any{
			"max_inflight_bytes": fit*len(plain) + len(plain)/2,
			"unknown_size":       hostileUnknown,
			"peer_share":         1,
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
	if !assert.Eventually(t, func() bool {
		return gate.entered.Load() == fit && env.requests(t, "http", decision.SignalTraces, "denied", "budget") == burst-fit
	}, e2eWait, time.Millisecond) {
		t.Fatalf("admitted %d, delivering %d, refused %d of %d", env.requests(t, "http", decision.SignalTraces, "allowed", "")-1,
			gate.entered.Load(), env.requests(t, "http", decision.SignalTraces, "denied", "budget"), burst)
	}
	assert.EqualValues(t, 1+fit, env.requests(t, "http", decision.SignalTraces, "allowed", ""), "admitted more than fit")
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
		"admission": map[string]any{"max_inflight_bytes": 320 << 10, "unknown_size": hostileUnknown, "peer_share": 1},
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
