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
	conn, err := net.DialTimeout("tcp", addr, admissionWait)
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
// and then send a byte a second. They are admitted with what a body of
// their signal reserves first (unknown_size here, as nothing has been
// learnt), not with what they announce, so a request of a third of the
// budget is still admitted next to them.
func TestHTTPSlowBodiesHoldLittle(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, NewBudget(maxBytes), 16<<10, nil)
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close) // after the slow clients' cleanups: Close waits for their requests
	for range 2 {
		slowClient(t, srv.Listener.Addr().String(), maxBytes/2, 1, time.Second)
	}
	require.Eventually(t, func() bool { return f.rec.get(ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit) == 2 },
		admissionWait, time.Millisecond)
	assert.EqualValues(t, 2*16<<10, f.budget.Reserved(), "each holds its first reservation, not its Content-Length")

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
	f := newHTTPFixture(t, NewBudget(64<<10), 16<<10, nil, func(c *Config) { c.IdleTimeout = time.Second })
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	conn := slowClient(t, srv.Listener.Addr().String(), 32<<10, 100, 0)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "no answer: the silent body still holds its reservation")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "retryable, never 400")
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, string(body), "request body slower than 64 KiB per 1s")
	require.Eventually(t, func() bool { return f.budget.Reserved() == 0 }, admissionWait, time.Millisecond)
	assert.EqualValues(t, 100, f.next.read.Load())
}

// TestHTTPTrickleIsCut: a body that trickles a byte now and then first
// loses its head start (it holds at most readStep beyond what it has sent,
// not the large first reservation it was admitted with), and is then cut
// off like a silent one: a byte is no progress, readStep per idle_timeout
// is. A body on a slow link that keeps that pace is never cut.
func TestHTTPTrickleIsCut(t *testing.T) {
	f := newHTTPFixture(t, NewBudget(1<<20), 512<<10, nil, func(c *Config) { c.IdleTimeout = time.Second })
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	conn := slowClient(t, srv.Listener.Addr().String(), 600<<10, 1, 50*time.Millisecond)
	require.Eventually(t, func() bool { return f.rec.get(ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit) == 1 },
		admissionWait, time.Millisecond)
	require.Eventually(t, func() bool { return f.budget.Reserved() <= 2*readStep },
		admissionWait, 10*time.Millisecond, "the trickling body keeps its head start")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "the trickling body is never cut")
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.Eventually(t, func() bool { return f.budget.Reserved() == 0 }, admissionWait, time.Millisecond)

	// 600 KiB at 16 KiB every 100 ms: under readStep per interval, but
	// readStep well within every idle_timeout.
	slow := slowWriter(t, srv.Listener.Addr().String(), 600<<10, 16<<10, 100*time.Millisecond)
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

// TestHTTPPeerShare: the requests of one peer (remote IP) are admitted up
// to its share of the budget and then refused although the budget has room,
// while another peer is admitted; an IPv6 peer counts by its /64. A single
// request larger than the share is admitted, as a request larger than the
// budget is, and grows as it is read.
func TestHTTPPeerShare(t *testing.T) {
	const maxBytes = 256 << 10
	b := NewBudgetWith(BudgetConfig{Max: maxBytes, PeerShare: 0.5, Wait: DefaultBudgetWait})
	f := newHTTPFixture(t, b, 32<<10, nil)
	hold := make(chan struct{})
	entered := make(chan struct{}, 8)
	held := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		entered <- struct{}{}
		<-hold
		w.WriteHeader(http.StatusOK)
	}))
	serve := func(h http.Handler, path, remote string, size int) int {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(make([]byte, size)))
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	const peerA = "10.0.0.1:1000"
	other := func(avoid ...string) string {
		for i := 2; ; i++ {
			addr := fmt.Sprintf("10.0.%d.%d:1000", i/250, i%250)
			clash := false
			for _, a := range avoid {
				clash = clash || b.peerOfRemote(addr) == b.peerOfRemote(a)
			}
			if !clash {
				return addr
			}
		}
	}

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { assert.Equal(t, http.StatusOK, serve(held, "/v1/traces", peerA, 32<<10)) })
	}
	for range 4 {
		<-entered
	}
	assert.EqualValues(t, maxBytes/2, b.Reserved(), "peer A holds its share")
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, "/v1/logs", "10.0.0.1:2000", 1<<10), "A's share is used up")
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, "/v1/logs", "[::ffff:10.0.0.1]:3000", 1<<10), "the same address, mapped")
	peerB := other(peerA)
	assert.Equal(t, http.StatusOK, serve(f.h, "/v1/logs", peerB, 1<<10), "another peer is admitted")
	close(hold)
	wg.Wait()
	assert.Zero(t, b.Reserved())

	peerC := other(peerA, peerB)
	assert.Equal(t, http.StatusOK, serve(f.h, "/v1/traces", peerC, maxBytes*3/4), "one request larger than the share")
	assert.Zero(t, b.Reserved())

	assert.Equal(t, b.peerOfRemote("[2001:db8:0:1::1]:1"), b.peerOfRemote("[2001:db8:0:1:ffff::2]:2"), "an IPv6 peer is its /64")
	assert.Equal(t, b.peerOfRemote("192.0.2.1:1"), b.peerOfRemote("[::ffff:192.0.2.1]:2"))
	assert.Zero(t, b.peerOfRemote("@unix"), "not an IP: no per-peer limit")
	assert.EqualValues(t, 1<<10, NewBudget(1<<10).maxFor(b.peerOfRemote(peerA)), "no share: no per-peer limit")
}

// TestHTTPBodyWaitsForRelease: a body of unknown size (compressed, or
// chunked) that outgrows its reservation while others hold the rest of the
// budget waits for bytes to be released instead of failing at once (and
// having its decompression wasted), and then completes.
func TestHTTPBodyWaitsForRelease(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, NewBudgetWith(BudgetConfig{Max: maxBytes, Wait: admissionWait}), 16<<10, nil)
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
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(make([]byte, 48<<10)))
		req.Header.Set("X-Hold", "1")
		h.ServeHTTP(httptest.NewRecorder(), req)
	})
	require.Eventually(t, func() bool { return f.budget.Reserved() == 48<<10 }, admissionWait, time.Millisecond)

	code := make(chan int, 1)
	wg.Go(func() {
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", io.NopCloser(bytes.NewReader(make([]byte, 40<<10))))
		req.ContentLength = -1
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code <- rec.Code
	})
	require.Eventually(t, func() bool { return progress.Load() == 16<<10 }, admissionWait, time.Millisecond,
		"the second body reads its first reservation")
	close(hold)
	assert.Equal(t, http.StatusOK, <-code, "it waited for the first request to finish")
	assert.EqualValues(t, 40<<10, progress.Load())
	wg.Wait()
	assert.Zero(t, f.budget.Reserved())
}

// TestHTTPLearnsInitialSize: a body of unknown size first reserves
// unknown_size; once bodies of its signal have been read to their end, the
// next ones reserve what those turned out to be (per signal), so that they
// need not grow (and wait, or fail) mid-read.
func TestHTTPLearnsInitialSize(t *testing.T) {
	f := newHTTPFixture(t, NewBudget(1<<20), 16<<10, nil)
	var first atomic.Int64
	h := f.mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		first.Store(f.budget.Reserved())
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
	assert.Zero(t, f.budget.Reserved())
}

// TestHTTPOverBudgetBodyDoesNotStarve: a body larger than the whole budget
// needs a moment with nothing else reserved. Once it waits for it, new
// admissions stop, so it runs as soon as the requests already admitted
// finish, instead of being refused for as long as others come and go.
func TestHTTPOverBudgetBodyDoesNotStarve(t *testing.T) {
	const maxBytes = 64 << 10
	f := newHTTPFixture(t, NewBudgetWith(BudgetConfig{Max: maxBytes, Wait: admissionWait}), 16<<10, nil)
	hold := make(chan struct{})
	entered := make(chan struct{}, 2)
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Hold") != "" {
			entered <- struct{}{}
			<-hold
		}
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Read", strconv.FormatInt(n, 10))
	}))
	serve := func(size int, holdIt bool) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(make([]byte, size)))
		if holdIt {
			req.Header.Set("X-Hold", "1")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { assert.Equal(t, http.StatusOK, serve(8<<10, true).Code) })
	}
	<-entered
	<-entered

	big := make(chan *httptest.ResponseRecorder, 1)
	wg.Go(func() { big <- serve(maxBytes+(maxBytes>>1), false) })
	// Small requests fit beside the two held ones until the big one waits
	// for the whole budget; from then on they are refused.
	require.Eventually(t, func() bool { return serve(1<<10, false).Code == http.StatusTooManyRequests },
		admissionWait, time.Millisecond, "new requests are still admitted while the large one waits")
	assert.Equal(t, http.StatusTooManyRequests, serve(1<<10, false).Code)
	close(hold)
	rec := <-big
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, strconv.Itoa(maxBytes+(maxBytes>>1)), rec.Header().Get("X-Read"))
	wg.Wait()
	assert.Zero(t, f.budget.Reserved())
	assert.EqualValues(t, maxBytes, f.highWater.Load(), "it held the whole budget, never more")
}

// TestBudgetWaitOldestFirst drives the budget's wait directly: bytes
// released go to the oldest waiting body, not to the one waiting longest,
// and admissions leave free what the waiting bodies need.
func TestBudgetWaitOldestFirst(t *testing.T) {
	b := NewBudgetWith(BudgetConfig{Max: 100, Wait: admissionWait})
	require.True(t, b.Reserve(100), "a request that is not waiting holds everything")
	ctx := context.Background()
	older, younger := &waiter{age: 1}, &waiter{age: 2}
	olderOK, youngerOK := make(chan bool, 1), make(chan bool, 1)
	go func() {
		ok, _ := b.waitGrow(ctx, younger, 60, 0, 0, admissionWait)
		youngerOK <- ok
	}()
	require.Eventually(t, func() bool { return b.waiting.Load() == 1 }, admissionWait, time.Millisecond)
	go func() {
		ok, _ := b.waitGrow(ctx, older, 60, 0, 0, admissionWait)
		olderOK <- ok
	}()
	require.Eventually(t, func() bool { return b.waiting.Load() == 2 }, admissionWait, time.Millisecond)

	b.Release(60)
	assert.True(t, <-olderOK, "the older body is served first")
	b.Release(40)
	assert.False(t, b.Reserve(1), "an admission leaves free what the younger body needs")
	select {
	case <-youngerOK:
		t.Fatal("the younger body took bytes the older one needed")
	default:
	}
	b.Release(60) // the older body's request finishes
	assert.True(t, <-youngerOK)
	b.Release(60)
	assert.Zero(t, b.Reserved())
	assert.Zero(t, b.pending.Load())
}

// TestBudgetWaitYoungestYields: when the waiting bodies hold the budget
// between them and the oldest cannot be served even if everything else
// finished, the youngest gives up at once (not after its wait), so that the
// older one can finish.
func TestBudgetWaitYoungestYields(t *testing.T) {
	b := NewBudgetWith(BudgetConfig{Max: 100, Wait: admissionWait})
	require.True(t, b.Reserve(50))
	require.True(t, b.Reserve(50))
	ctx := context.Background()
	older, younger := &waiter{age: 1}, &waiter{age: 2}
	olderOK, youngerOK := make(chan bool, 1), make(chan bool, 1)
	go func() {
		ok, _ := b.waitGrow(ctx, older, 10, 50, 0, admissionWait)
		olderOK <- ok
	}()
	require.Eventually(t, func() bool { return b.waiting.Load() == 1 }, admissionWait, time.Millisecond)
	go func() {
		ok, _ := b.waitGrow(ctx, younger, 10, 50, 0, admissionWait)
		youngerOK <- ok
	}()
	select {
	case ok := <-youngerOK:
		assert.False(t, ok)
	case <-time.After(admissionWait / 2):
		t.Fatal("the younger body waited instead of yielding")
	}
	b.Release(50) // the younger body's request fails and returns its bytes
	assert.True(t, <-olderOK)
	b.Release(60)
	assert.Zero(t, b.Reserved())
}

// TestGRPCSilentStream: a stream that sends no message within idle_timeout
// keeps only minEstimate of its reservation (issue 28 point 5: silent
// streams reopened again and again hold next to nothing), and is cancelled
// only after silentFactor idle timeouts; a stream whose message takes
// longer than idle_timeout to arrive (a large batch on a slow link) is not
// cancelled but accepted (point 6), and one whose message arrived is never
// cut, however long its handler takes.
func TestGRPCSilentStream(t *testing.T) {
	const idle = time.Second
	f := newGRPCFixture(t, NewBudget(1<<20), 0, func(c *Config) { c.IdleTimeout = idle })
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	cs, err := f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.budget.Reserved() == DefaultUnknownSize }, admissionWait, time.Millisecond)
	require.Eventually(t, func() bool { return f.budget.Reserved() == minEstimate }, admissionWait, time.Millisecond,
		"trimmed once idle")
	err = cs.RecvMsg(new(emptypb.Empty))
	assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	f.requireReleased(t)

	// The message comes after twice the idle timeout: charged as it
	// arrives, and accepted.
	late, err := f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.budget.Reserved() == minEstimate }, admissionWait, time.Millisecond)
	time.Sleep(idle)
	require.NoError(t, late.SendMsg(wrapperspb.Bytes(make([]byte, 64<<10))))
	require.NoError(t, late.CloseSend())
	require.NoError(t, late.RecvMsg(new(emptypb.Empty)), "a slow message is not cancelled")
	f.requireReleased(t)

	f.push.hold = make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- f.pushAll(ctx, 1, 10) }()
	require.Eventually(t, func() bool { return f.push.messages.Load() == 2 }, admissionWait, time.Millisecond)
	time.Sleep(idle + time.Second) // past idle_timeout: the stream must still be alive
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

// peerAtShare returns a gRPC fixture whose budget (4000 bytes, a peer
// share of 0.5, the given wait) is held to this client's share by two idle
// streams of ctx; with maxHeld > 0 it has a queue of that many places.
func peerAtShare(ctx context.Context, t *testing.T, wait time.Duration, maxHeld int) (*grpcFixture, *Budget) {
	t.Helper()
	b := NewBudgetWith(BudgetConfig{Max: 4000, PeerShare: 0.5, Wait: wait})
	f := newGRPCFixture(t, b, 1000, func(c *Config) {
		if maxHeld > 0 {
			c.Hold = NewHold(c.Decider, nil, admissionWait, maxHeld, 0)
		}
	})
	for range 2 {
		_, err := f.pushStream(ctx)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.Reserved() == 2000 }, admissionWait, time.Millisecond)
	return f, b
}

// otherLocal returns a loopback address whose peer slot is not this
// client's (127.0.0.1), whatever the seed.
func otherLocal(b *Budget) string {
	local := "127.0.0.2"
	for i := 3; b.peerOfRemote(local+":1") == b.peerOfRemote("127.0.0.1:1"); i++ {
		local = fmt.Sprintf("127.0.0.%d", i)
	}
	return local
}

// TestGRPCPeerShare: the streams of one connection's peer are admitted up
// to its share of the budget, before any authentication could run; a
// client from another address is admitted meanwhile.
func TestGRPCPeerShare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	f, b := peerAtShare(ctx, t, DefaultBudgetWait, 0)
	cs, err := f.pushStream(ctx)
	require.NoError(t, err)
	requireRetryable(t, cs.RecvMsg(new(emptypb.Empty)), "budget", grpcRetryLow)
	assert.EqualValues(t, 2000, b.Reserved(), "refused although half the budget is free")

	require.NoError(t, f.pushAllOn(ctx, grpcConnFrom(t, f.addr, otherLocal(b)), 1, 10))
	cancel()
	f.requireReleased(t)
}

// TestGRPCWaitKeepsPeerShare: a stream that waits for its bytes (the hold
// on) is bound by its peer's share as one admitted at once is: with half
// the budget free but its peer at its share, it is refused at the end of
// its wait, and the peer never holds more than its share.
func TestGRPCWaitKeepsPeerShare(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	f, _ := peerAtShare(ctx, t, 200*time.Millisecond, 8)
	// It waits for most of its deadline: give it a short one.
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	err := f.export(short)
	if status.Code(err) != codes.Canceled {
		requireRetryable(t, err, "budget", grpcRetryLow)
	}
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.traces.calls.Load())
	assert.Less(t, f.highWater.Load(), int64(3000), "the waiting stream never got its 1000 bytes (only its message, once it had arrived, is counted)")
	cancel()
	f.requireReleased(t)
}

// TestHTTPBudgetNoWait: an HTTP request that finds the budget full is
// refused at once, its body unread, even with the hold on (waiting cost
// the worst-case client goodput and tail: design §12); and it leaves free
// what the oldest request waiting in line for the budget (a gRPC stream)
// needs, rather than passing it.
func TestHTTPBudgetNoWait(t *testing.T) {
	const long = 10 * time.Second
	b := NewBudgetWith(BudgetConfig{Max: 100, Wait: long})
	f := newHTTPFixture(t, b, 0, nil, func(c *Config) { c.Hold = NewHold(c.Decider, nil, long, 8, testTick) })
	serve := func(body io.Reader) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", body)
		req.ContentLength = 40
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, req)
		return rec
	}

	require.True(t, b.Reserve(70))
	rec := serve(&failingBody{t: t})
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	assert.Zero(t, f.mw.hold.Held())

	// A request waits in line for 50 of the 30 free: the HTTP request's 30
	// would fit, but it does not pass the stream waiting for its bytes
	// (which would otherwise wait out its deadline while requests that do
	// not wait take every byte released); refused at once, not held.
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan bool, 1)
	go func() { waited <- b.waitAdmit(ctx, 50, 0, long) }()
	require.Eventually(t, func() bool { return b.entering.Load() == 1 }, long, time.Millisecond)
	post := func() int {
		req := httptest.NewRequest(http.MethodPost, "/v1/traces", bytes.NewReader(make([]byte, 30)))
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, req)
		return rec.Code
	}
	assert.Equal(t, http.StatusTooManyRequests, post())
	assert.EqualValues(t, 1, b.entering.Load())
	assert.Zero(t, f.mw.hold.Held())
	cancel()
	assert.False(t, <-waited)
	assert.Equal(t, http.StatusOK, post(), "nobody waits: it fits")
	b.Release(70)
	assert.Zero(t, b.Reserved())
}

// TestGRPCFullQueueNoLockout: a peer whose streams wait for the budget and
// fill the queue does not lock the others out: another peer's stream, with
// no place in the queue to wait in, is admitted if its bytes fit in the
// budget and its own share.
func TestGRPCFullQueueNoLockout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	f, b := peerAtShare(ctx, t, admissionWait, 1)
	// A third stream of the same peer waits, passed over, in the queue's
	// only place.
	go func() { _ = f.export(ctx) }()
	require.Eventually(t, func() bool { return b.entering.Load() == 1 }, admissionWait, time.Millisecond)
	require.EqualValues(t, 1, f.mw.hold.Held())

	require.NoError(t, f.pushAllOn(ctx, grpcConnFrom(t, f.addr, otherLocal(b)), 1, 10), "another peer's stream is admitted")
	assert.EqualValues(t, 1, b.entering.Load(), "the first peer's stream still waits")
	cancel()
	f.requireReleased(t)
}
