// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

// Tests of the admission budget against slow, silent, greedy and large
// requests: the budget must not be held, poisoned or wasted.

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
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/otelthrottle/throttle/internal/decision"
)

// admissionWait bounds every wait of these tests.
const admissionWait = 20 * time.Second

// slowClient writes a request head and the first bytes of a body that it
// announces longer, on a raw connection, and then writes one more byte
// every interval (never, if interval is 0) until the test ends.
func slowClient(t *testing.T, addr string, contentLength, first int, interval time.Duration) net.Conn {
	t.Helper()
	return slowClientFrom(t, addr, "", contentLength, first, interval)
}

// slowClientFrom is slowClient from the loopback address local ("": the
// system's choice).
func slowClientFrom(t *testing.T, addr, local string, contentLength, first int, interval time.Duration) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: admissionWait}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	conn, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	require.NoError(t, conn.SetDeadline(time.Now().Add(admissionWait)))
	head := fmt.Sprintf("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", contentLength)
	_, err = conn.Write(append([]byte(head), make([]byte, first)...))
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if interval > 0 {
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := conn.Write([]byte{'x'}); err != nil {
						return
					}
				}
			}
		})
	}
	t.Cleanup(func() {
		close(stop)
		conn.Close()
		wg.Wait()
	})
	return conn
}

// TestHTTPSlowBodiesHoldLittle: two clients announce half the budget each
// and then send a byte a second. Once their first byte has arrived they
// hold what a body of their signal reserves first (unknown_size here, as
// nothing has been learnt), not what they announce, so a request of a
// third of the budget is still admitted next to them.
func TestHTTPSlowBodiesHoldLittle(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, maxBytes, withUnknownSize(16<<10))
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close) // after the slow clients' cleanups: Close waits for their requests
	for range 2 {
		slowClient(t, srv.Listener.Addr().String(), maxBytes/2, 1, time.Second)
	}
	require.Eventually(t, func() bool { return f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictAdmit) == 2 },
		admissionWait, time.Millisecond)
	assert.EqualValues(t, 2*16<<10, f.stats().Reserved, "each holds its first reservation, not its Content-Length")

	resp, err := srv.Client().Post(srv.URL+"/v1/traces", "application/x-protobuf", bytes.NewReader(make([]byte, maxBytes/3)))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestHTTPIdleBodyCutOff: a client that stops sending its body is cut off
// once it has sent nothing for idle_timeout: the handler's read fails with
// a retryable error (otlpreceiver answers it 429 + Retry-After, which the
// OTLP exporters retry: a 400 they would drop) and the reservation is
// released, without any timeout on the server.
func TestHTTPIdleBodyCutOff(t *testing.T) {
	f := newHTTPFixture(t, 64<<10, withUnknownSize(16<<10), withIdle(200*time.Millisecond))
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	conn := slowClient(t, srv.Listener.Addr().String(), 32<<10, 100, 0)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "no answer: the silent body still holds its reservation")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "retryable, never 400")
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, string(body), "request body slower than 64 KiB per")
	f.requireReleased(t)
	assert.EqualValues(t, 100, f.next.read.Load())
}

// TestHTTPTrickleIsCut: a body that trickles a byte now and then first
// loses its head start (it holds at most 64 KiB beyond what it has sent,
// not the large first reservation it was admitted with), and is then cut
// off like a silent one: a byte is no progress, 64 KiB per idle_timeout
// is. A body on a slow link that keeps that pace is never cut.
func TestHTTPTrickleIsCut(t *testing.T) {
	const idle = 500 * time.Millisecond
	const readStep = 64 << 10
	f := newHTTPFixture(t, 1<<20, withUnknownSize(512<<10), withIdle(idle))
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	conn := slowClient(t, srv.Listener.Addr().String(), 600<<10, 1, 20*time.Millisecond)
	require.Eventually(t, func() bool { return f.stats().Reserved == 512<<10 }, admissionWait, time.Millisecond)
	require.Eventually(t, func() bool { return f.stats().Reserved <= 2*readStep },
		admissionWait, 10*time.Millisecond, "the trickling body keeps its head start")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "the trickling body is never cut")
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	f.requireReleased(t)

	// 256 KiB at 16 KiB every 50 ms: under 64 KiB per read, but 64 KiB
	// well within every idle_timeout.
	slow := slowWriter(t, srv.Listener.Addr().String(), 256<<10, 16<<10, 50*time.Millisecond)
	resp, err = http.ReadResponse(bufio.NewReader(slow), nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a slow honest body gets in")
}

// slowWriter sends a request whose body of size bytes goes out chunk bytes
// every interval.
func slowWriter(t *testing.T, addr string, size, chunk int, interval time.Duration) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, admissionWait)
	require.NoError(t, err)
	require.NoError(t, conn.SetDeadline(time.Now().Add(admissionWait)))
	t.Cleanup(func() { conn.Close() })
	head := fmt.Sprintf("POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", size)
	_, err = conn.Write([]byte(head))
	require.NoError(t, err)
	go func() {
		for sent := 0; sent < size; sent += chunk {
			if _, err := conn.Write(make([]byte, min(chunk, size-sent))); err != nil {
				return
			}
			time.Sleep(interval)
		}
	}()
	return conn
}

// heldHandler reads each body to its end, tells entered, and answers once
// hold is closed: the requests it serves hold their bytes meanwhile.
func heldHandler(f *httpFixture, entered chan<- struct{}, hold <-chan struct{}) http.Handler {
	return f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			writeReadError(w, err)
			return
		}
		entered <- struct{}{}
		<-hold
		w.WriteHeader(http.StatusOK)
	}))
}

// TestHTTPKeyShare: the requests of one key (remote address) are admitted
// up to its share of the budget and then refused, unread, although the
// budget has room, while another key is admitted. A single request larger
// than the share is admitted, as a request larger than the budget is, and
// reads on in the oversize lane.
func TestHTTPKeyShare(t *testing.T) {
	const maxBytes = 256 << 10
	f := newHTTPFixture(t, maxBytes, withDefaultShare(), withUnknownSize(32<<10))
	hold := make(chan struct{})
	entered := make(chan struct{}, 8)
	held := heldHandler(f, entered, hold)
	const peerA = "10.0.0.1:1000"

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { assert.Equal(t, http.StatusOK, serve(held, post("/v1/traces", peerA, 32<<10)).Code) })
	}
	for range 4 {
		<-entered
	}
	assert.EqualValues(t, maxBytes/2, f.stats().Reserved, "peer A holds its share")
	assert.EqualValues(t, maxBytes/2, f.keyReserved("10.0.0.1"))
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, post("/v1/logs", "10.0.0.1:2000", 1<<10)).Code, "A's share is used up")
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, post("/v1/logs", "[::ffff:10.0.0.1]:3000", 1<<10)).Code, "the same address, mapped")
	assert.Zero(t, f.next.calls.Load(), "refused before the handler")
	assert.EqualValues(t, 2, f.rec.get(protoHTTP, decision.SignalLogs, decision.VerdictDenyBudget))
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/logs", "10.0.0.2:1000", 1<<10)).Code, "another key is admitted")
	close(hold)
	wg.Wait()
	assert.Zero(t, f.stats().Reserved)

	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", "10.0.0.3:1000", maxBytes*3/4)).Code, "one request larger than the share")
	assert.EqualValues(t, maxBytes*3/4+1<<10, f.next.read.Load())
	assert.Zero(t, f.stats().Reserved)
}

// TestHTTPKeyOfAddress: an IPv6 client is keyed by its /64, so that it
// cannot escape its share by changing the low bits; a client that is not
// IP (a unix socket) has no share of its own, only the budget.
func TestHTTPKeyOfAddress(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, maxBytes, withDefaultShare(), withUnknownSize(32<<10))
	release := f.reserve(t, "2001:db8:0:1::1", decision.SignalTraces, maxBytes/2)
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, post("/v1/traces", "[2001:db8:0:1:ffff::2]:2", 1)).Code, "the same /64")
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", "[2001:db8:0:2::1]:1", 1)).Code, "another /64")
	release()

	hold := make(chan struct{})
	entered := make(chan struct{}, 2)
	held := heldHandler(f, entered, hold)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { assert.Equal(t, http.StatusOK, serve(held, post("/v1/traces", "@", maxBytes/2)).Code) })
	}
	<-entered
	<-entered
	assert.EqualValues(t, maxBytes, f.stats().Reserved, "not IP: no share, the whole budget")
	close(hold)
	wg.Wait()
}

// TestHTTPBodyWaitsForRelease: a body of unknown size (compressed, or
// chunked) that outgrows its reservation while others hold the rest of the
// budget waits for bytes to be released instead of failing at once (and
// having its decompression wasted), and then completes.
func TestHTTPBodyWaitsForRelease(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, maxBytes, withUnknownSize(16<<10), withWait(admissionWait))
	hold := make(chan struct{})
	var progress atomic.Int64
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			_, _ = io.Copy(io.Discard, r.Body)
			<-hold
			return
		}
		buf := make([]byte, 1024)
		for {
			n, err := r.Body.Read(buf)
			progress.Add(int64(n))
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
		}
	}))
	var wg sync.WaitGroup
	wg.Go(func() {
		req := post("/v1/traces", "192.0.2.1:1", 48<<10)
		req.Header.Set("X-Hold", "1")
		h.ServeHTTP(httptest.NewRecorder(), req)
	})
	require.Eventually(t, func() bool { return f.stats().Reserved == 48<<10 }, admissionWait, time.Millisecond)

	code := make(chan int, 1)
	wg.Go(func() { code <- serve(h, chunkedTraces("192.0.2.1:1", 40<<10)).Code })
	require.Eventually(t, func() bool { return progress.Load() == 16<<10 }, admissionWait, time.Millisecond,
		"the second body reads its first reservation")
	close(hold)
	assert.Equal(t, http.StatusOK, <-code, "it waited for the first request to finish")
	assert.EqualValues(t, 40<<10, progress.Load())
	wg.Wait()
	assert.Zero(t, f.stats().Reserved)
}

// TestHTTPLearnsInitialSize: a body of unknown size first reserves
// unknown_size; once bodies of its signal have been read to their end, the
// next ones reserve what those turned out to be (per signal), so that they
// need not grow (and wait, or fail) mid-read.
func TestHTTPLearnsInitialSize(t *testing.T) {
	f := newHTTPFixture(t, 1<<20, withUnknownSize(16<<10))
	var first atomic.Int64
	h := f.mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = r.Body.Read(make([]byte, 1))
		first.Store(f.stats().Reserved)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	send := func(path string, size int, known bool) int64 {
		req := httptest.NewRequest(http.MethodPost, path, io.NopCloser(bytes.NewReader(make([]byte, size))))
		req.ContentLength = -1
		if known {
			req.ContentLength = int64(size)
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
		return first.Load()
	}
	assert.EqualValues(t, 16<<10, send("/v1/traces", 40<<10, false), "unknown_size at first")
	assert.EqualValues(t, 40<<10, send("/v1/traces", 40<<10, false), "then what traces bodies turned out to be")
	assert.EqualValues(t, 16<<10, send("/v1/logs", 40<<10, false), "per signal")
	assert.EqualValues(t, 1<<10, send("/v1/traces", 1<<10, true), "a smaller Content-Length is exact")
	assert.EqualValues(t, 40<<10, send("/v1/traces", 100<<10, true), "a larger one starts with the learnt size")
	assert.Zero(t, f.stats().Reserved)
}

// TestHTTPOverBudgetBodyDoesNotStarve: a body larger than the whole budget
// grows while the others finish: once it waits for bytes, new bodies leave
// it what it needs (they are refused at their first byte), so it gets the
// whole budget as soon as the requests already admitted finish, and reads
// the rest in the oversize lane, instead of being refused for as long as
// others come and go.
func TestHTTPOverBudgetBodyDoesNotStarve(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, maxBytes, withUnknownSize(16<<10), withWait(admissionWait))
	hold := make(chan struct{})
	entered := make(chan struct{}, 2)
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Hold") != "" {
			entered <- struct{}{}
			<-hold
		}
		if err != nil {
			writeReadError(w, err)
			return
		}
		w.Header().Set("X-Read", strconv.FormatInt(n, 10))
	}))
	send := func(size int, holdIt bool) *httptest.ResponseRecorder {
		req := post("/v1/traces", "192.0.2.1:1", size)
		if holdIt {
			req.Header.Set("X-Hold", "1")
		}
		return serve(h, req)
	}
	// A small request whose client gives up soon: one that waits in line
	// behind the large body ends within its deadline.
	sendSmall := func() *httptest.ResponseRecorder {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		return serve(h, post("/v1/traces", "192.0.2.1:1", 1<<10).WithContext(ctx))
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { assert.Equal(t, http.StatusOK, send(8<<10, true).Code) })
	}
	<-entered
	<-entered

	big := make(chan *httptest.ResponseRecorder, 1)
	wg.Go(func() { big <- send(maxBytes+(maxBytes>>1), false) })
	// Small requests fit beside the two held ones until the big one waits
	// for what is left; from then on none takes it: each is refused, at
	// once or, when it fits in what is free while the big one waits for
	// more, as its client's deadline ends.
	require.Eventually(t, func() bool { return f.stats().Waiting == 1 },
		admissionWait, time.Millisecond, "the large body waits for the budget")
	for range 3 {
		assert.Equal(t, http.StatusTooManyRequests, sendSmall().Code, "a new request passed the large one")
	}
	close(hold)
	rec := <-big
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, strconv.Itoa(maxBytes+(maxBytes>>1)), rec.Header().Get("X-Read"))
	wg.Wait()
	assert.Zero(t, f.stats().Reserved)
	assert.EqualValues(t, maxBytes, f.stats().Peak, "it held the whole budget, never more")
}

// TestGRPCSilentStream: a stream that sends no message holds what its
// message may decode to, and is cancelled after six idle timeouts (a
// silent call holds its reservation only so long); a stream whose message
// takes longer than idle_timeout to arrive (a large batch on a slow link)
// is not cancelled but accepted, and one whose message arrived is never
// cut, however long its handler takes.
func TestGRPCSilentStream(t *testing.T) {
	const idle = 100 * time.Millisecond
	f := newGRPCFixture(t, 8<<20, withIdle(idle))
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	start := time.Now()
	cs, err := f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.stats().Reserved == callSize(8<<20) },
		admissionWait, time.Millisecond, "it holds what its message may decode to, not unknown_size")
	err = cs.RecvMsg(new(emptypb.Empty))
	assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	assert.GreaterOrEqual(t, time.Since(start), 6*idle, "not before six idle timeouts")
	f.requireReleased(t)

	// The message comes after twice the idle timeout: accepted.
	late, err := f.pushStream(ctx)
	require.NoError(t, err)
	time.Sleep(2 * idle)
	require.NoError(t, late.SendMsg(wrapperspb.Bytes(make([]byte, 64<<10))))
	require.NoError(t, late.CloseSend())
	require.NoError(t, late.RecvMsg(new(emptypb.Empty)), "a slow message is not cancelled")
	f.requireReleased(t)

	f.push.hold = make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- f.pushAll(ctx, 1, 10) }()
	require.Eventually(t, func() bool { return f.push.messages.Load() == 2 }, admissionWait, time.Millisecond)
	time.Sleep(8 * idle) // past six idle timeouts: the call must still be alive
	close(f.push.hold)
	require.NoError(t, <-errc)
	f.requireReleased(t)
}

// grpcConnFrom dials addr from the loopback address local.
func grpcConnFrom(t *testing.T, addr, local string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// dialFrom dials from the loopback address local.
func dialFrom(local string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return d.DialContext
}

// keyAtShare returns a gRPC fixture with a budget of 4000 bytes and a
// share of 0.5 whose client (127.0.0.1) holds its share: two silent
// streams of ctx, each holding what its message may decode to, a quarter
// of the budget.
func keyAtShare(ctx context.Context, t *testing.T, opts ...admOption) *grpcFixture {
	t.Helper()
	f := newGRPCFixture(t, 4000, append([]admOption{withDefaultShare(), withUnknownSize(1000)}, opts...)...)
	for want := int64(1000); want <= 2000; want += 1000 {
		_, err := f.pushStream(ctx)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return f.stats().Reserved == want }, admissionWait, time.Millisecond)
		// The tap reserves the call's estimate; its Start (before the
		// handler runs) then claims what its message may decode to. A call
		// arriving between the two would find the key's undecoded calls
		// short of its share and be let in.
		require.Eventually(t, func() bool { return f.push.calls.Load() == want/1000 }, admissionWait, time.Millisecond)
	}
	return f
}

// TestGRPCKeyShare: the calls of one key are admitted up to its share of
// the budget, before any authentication could run; a client from another
// address is admitted meanwhile.
func TestGRPCKeyShare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	f := keyAtShare(ctx, t)
	cs, err := f.pushStream(ctx)
	require.NoError(t, err)
	requireRetryable(t, cs.RecvMsg(new(emptypb.Empty)), "budget", grpcRetryLow)
	assert.EqualValues(t, 2000, f.stats().Reserved, "refused although half the budget is free")

	require.NoError(t, f.pushAllOn(ctx, grpcConnFrom(t, f.addr, "127.0.0.2"), 1, 10))
	cancel()
	f.requireReleased(t)
}

// TestGRPCWaitKeepsKeyShare: a call that waits for its bytes (the hold
// on) is bound by its key's share as one admitted at once is: with half
// the budget free but its key at its share, it is refused at the end of
// its wait, and the key never holds more than its share.
func TestGRPCWaitKeepsKeyShare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	f := keyAtShare(ctx, t, withHold(admissionWait, 8))
	// It waits for most of its deadline, leaving a second: give it a short one.
	short, cancelShort := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancelShort()
	requireRefused(t, f.export(short), "budget", grpcRetryLow)
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.traces.calls.Load())
	assert.Zero(t, f.stats().HeldRequests)
	assert.EqualValues(t, 2000, f.stats().Peak, "the waiting call never got its bytes")
	cancel()
	f.requireReleased(t)
}

// TestHTTPBudgetWaitsInLine: an HTTP body that finds the budget full at
// its first byte, its key within its share, waits for its bytes in line
// behind the gRPC call that came first (which would otherwise wait out its
// deadline while requests that do not wait take every byte released), and
// is admitted once they are free; one whose wait runs out is refused (429,
// counted as a budget refusal).
func TestHTTPBudgetWaitsInLine(t *testing.T) {
	const budget, call = 256 << 10, 64 << 10
	a := newAdm(t, budget, withMaxMessage(call), withUnknownSize(budget), withWait(admissionWait), withHold(admissionWait, 8))
	hf := newHTTPFixtureOn(t, a)
	gf := newGRPCFixtureOn(t, a)
	release := a.reserve(t, "10.255.0.1", decision.SignalLogs, budget-40<<10)

	// The call waits for the 64 KiB it may decode, of the 40 KiB free; a
	// body of 30 KiB would fit, but waits behind it.
	errc := make(chan error, 1)
	go func() { errc <- gf.export(context.Background()) }()
	require.Eventually(t, func() bool { return a.stats().Waiting == 1 }, admissionWait, time.Millisecond, "the call waits")
	codec := make(chan int, 1)
	go func() { codec <- serve(hf.h, post("/v1/traces", "192.0.2.1:1", 30<<10)).Code }()
	require.Eventually(t, func() bool { return a.stats().Waiting == 2 }, admissionWait, time.Millisecond, "the body waits behind the call")
	assert.EqualValues(t, budget-40<<10, a.stats().Reserved, "nobody passed the call")
	release()
	require.NoError(t, <-errc, "the waiting call goes")
	assert.Equal(t, http.StatusOK, <-codec, "then the body")
	assert.Zero(t, a.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	a.requireReleased(t)

	// A body whose wait runs out is refused.
	short := newAdm(t, budget, withUnknownSize(budget), withWait(50*time.Millisecond))
	release = short.reserve(t, "10.255.0.1", decision.SignalLogs, budget-20<<10)
	rec := serve(newHTTPFixtureOn(t, short).h, post("/v1/traces", "192.0.2.1:1", 30<<10))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.EqualValues(t, 1, short.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
	release()
	short.requireReleased(t)
}

// TestGRPCFullHoldNoLockout: a key whose calls wait for the budget and
// fill the hold does not lock the others out: another key's call, with no
// place in the hold to wait in, is admitted if its bytes fit in the budget
// and its own share.
func TestGRPCFullHoldNoLockout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	f := keyAtShare(ctx, t, withHold(admissionWait, 1))
	// A second call of the same key waits, passed over, in the hold's
	// only place.
	waitCtx, cancelWait := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() { waited <- f.export(waitCtx) }()
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 1 }, admissionWait, time.Millisecond)

	require.NoError(t, f.pushAllOn(ctx, grpcConnFrom(t, f.addr, "127.0.0.2"), 1, 10), "another key's call is admitted")
	assert.EqualValues(t, 1, f.stats().HeldRequests, "the first key's call still waits")
	assert.Zero(t, f.traces.calls.Load())
	cancelWait()
	require.Error(t, <-waited)
	cancel()
	f.requireReleased(t)
}

// TestShutdownCutsOff: when the receivers start to stop (Close), every
// held request is refused at once, and every unfinished request that is
// still receiving its body (HTTP) or has not sent its message (gRPC) is
// cut off after a second, so that the servers' shutdown is not held up by
// clients that send nothing; new requests are no longer held.
func TestShutdownCutsOff(t *testing.T) {
	a := newAdm(t, 8<<20, withUnknownSize(16<<10), withHold(admissionWait, 8))
	hf := newHTTPFixtureOn(t, a)
	gf := newGRPCFixtureOn(t, a)
	srv := httptest.NewServer(hf.h)
	t.Cleanup(srv.Close)

	slow := slowClient(t, srv.Listener.Addr().String(), 32<<10, 100, 0)
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	silent, err := gf.pushStream(ctx)
	require.NoError(t, err)
	a.dec.set(decision.SignalMetrics, decision.VerdictDenyShed)
	heldCode := make(chan int, 1)
	go func() { heldCode <- serve(hf.h, post("/v1/metrics", "192.0.2.1:1", 10)).Code }()
	require.Eventually(t, func() bool { s := a.stats(); return s.HeldRequests == 1 && s.Inflight == 2 },
		admissionWait, time.Millisecond)

	a.adm.Close()
	assert.Equal(t, http.StatusTooManyRequests, <-heldCode, "the held request is refused at once")
	assert.Equal(t, http.StatusTooManyRequests, serve(hf.h, post("/v1/metrics", "192.0.2.1:1", 10)).Code, "nothing is held any more")
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	require.NoError(t, err, "the body that stopped coming is cut off")
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "retryable")
	assert.Equal(t, codes.Canceled, status.Code(silent.RecvMsg(new(emptypb.Empty))), "the silent stream is cancelled")
	a.requireReleased(t)
}
