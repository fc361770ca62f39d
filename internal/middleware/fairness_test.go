// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

// Tests that no single client can hold or inflate what the others need:
// the budget, the learnt sizes, the hold's places, the admissions under
// pressure; with clients told apart by address, tenant header, or
// authenticated subject.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

// heldRequests serves reqs concurrently through a heldHandler of f and
// returns once each has read its body; release answers them all and
// checks they were admitted.
func heldRequests(t *testing.T, f *httpFixture, reqs ...*http.Request) (release func()) {
	t.Helper()
	hold := make(chan struct{})
	entered := make(chan struct{}, len(reqs))
	h := heldHandler(f, entered, hold)
	var wg sync.WaitGroup
	for _, r := range reqs {
		wg.Go(func() { assert.Equal(t, http.StatusOK, serve(h, r).Code) })
	}
	for range reqs {
		select {
		case <-entered:
		case <-time.After(admissionWait):
			t.Fatal("a held request was not admitted")
		}
	}
	return func() {
		close(hold)
		wg.Wait()
	}
}

// TestHTTPFairShareContended: while nobody is refused for the budget one
// key may hold up to the configured share; once a request is refused for
// it, each of the n keys reading holds at most its fair share, 1/n: a key
// that holds more is refused (before its body is read) until it holds
// less, and a key below its share is admitted.
func TestHTTPFairShareContended(t *testing.T) {
	const budget = 400 << 10
	const quarter = budget / 4
	f := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(quarter))
	a, b, c, d := "127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1", "127.0.0.5:1"
	defer heldRequests(t, f,
		post("/v1/traces", a, quarter), post("/v1/traces", a, quarter/2), // 3/8: within the share of 1/2
		post("/v1/traces", b, quarter), post("/v1/traces", c, quarter))()
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", a, 1<<10)).Code, "uncontended: a may grow to the share")

	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, post("/v1/traces", d, quarter)).Code, "the budget is full for d")
	require.Eventually(t, func() bool { return serve(f.h, post("/v1/traces", a, 1<<10)).Code == http.StatusTooManyRequests },
		admissionWait, 10*time.Millisecond, "contended: a, over its fair share of a quarter, is refused")
	// Once the shares are computed again with d among the keys reading.
	require.Eventually(t, func() bool { return serve(f.h, post("/v1/traces", b, 1<<10)).Code == http.StatusTooManyRequests },
		admissionWait, 10*time.Millisecond, "b, holding its quarter, is refused")
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", d, 1<<10)).Code, "d, under its quarter, is admitted")
}

// TestHTTPSilentKeysHoldNothing: requests that send their headers and no
// body byte hold nothing and do not shrink the others' shares, from however
// many addresses they come: eight silent addresses beside one honest
// client, whose batches all get in.
func TestHTTPSilentKeysHoldNothing(t *testing.T) {
	const budget = 256 << 10
	f := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(64<<10))
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	for i := range 8 {
		slowClientFrom(t, srv.Listener.Addr().String(), fmt.Sprintf("127.0.0.%d", 2+i), 64<<10, 0, 0)
	}
	require.Eventually(t, func() bool { return f.stats().Inflight == 8 }, admissionWait, time.Millisecond)
	assert.Zero(t, f.stats().Reserved, "no body byte, no reservation")

	tr := &http.Transport{DialContext: dialFrom("127.0.0.10")}
	defer tr.CloseIdleConnections()
	honest := &http.Client{Transport: tr}
	for i := range 20 {
		resp, err := honest.Post(srv.URL+"/v1/traces", "application/x-protobuf", io.LimitReader(zeros{}, 64<<10))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "batch %d", i)
	}
	assert.Zero(t, f.stats().Reserved)
	assert.EqualValues(t, 8, f.stats().Inflight, "the silent requests are still there")
}

// zeros is an endless reader of zeros.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// TestHTTPLargeContentLengthNoLockout: a key that announces bodies larger
// than the budget and sends them slowly holds at most its share; other
// keys are admitted meanwhile.
func TestHTTPLargeContentLengthNoLockout(t *testing.T) {
	const maxBytes = 256 << 10
	f := newHTTPFixture(t, maxBytes, withDefaultShare(), withUnknownSize(32<<10), withWait(admissionWait))
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	// Two slow bodies from the loopback key, each announcing twice the
	// budget; the second waits for its key's share.
	for range 2 {
		slowClient(t, srv.Listener.Addr().String(), 2*maxBytes, maxBytes/4, time.Second)
	}
	require.Eventually(t, func() bool { return f.keyReserved("127.0.0.1") >= maxBytes/4 }, admissionWait, time.Millisecond,
		"the slow key holds most of its share")

	for range 4 {
		assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", "10.9.0.2:1", 16<<10)).Code, "another key is never locked out")
	}
	assert.LessOrEqual(t, f.keyReserved("127.0.0.1"), int64(maxBytes/2), "never more than its share")
}

// TestHTTPLearnsPerKeyFromAccepted: what a body reserves first is learnt
// per key, and only from bodies the handler accepted: a large body that
// fails to decode (or is refused by an authenticator) teaches nothing, and
// one key's large bodies do not raise what another's reserve.
func TestHTTPLearnsPerKeyFromAccepted(t *testing.T) {
	f := newHTTPFixture(t, 8<<20, withUnknownSize(16<<10))
	var reserved int64
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = r.Body.Read(make([]byte, 1))
		reserved = f.stats().Reserved
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Refuse") != "" {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	send := func(remote string, size int, refuse bool) int64 {
		req := chunkedTraces(remote, size) // as a compressed body: its length unknown
		if refuse {
			req.Header.Set("X-Refuse", "1")
		}
		h.ServeHTTP(httptest.NewRecorder(), req)
		return reserved
	}
	const a, b = "10.9.0.1:1", "10.9.0.2:1"
	assert.EqualValues(t, 16<<10, send(a, 1<<20, true), "unknown_size first")
	assert.EqualValues(t, 16<<10, send(a, 1<<10, false), "the refused 1 MiB body taught nothing")
	assert.EqualValues(t, 1<<10, send(a, 2<<20, false), "learnt from the accepted one")
	assert.EqualValues(t, 2<<20, send(a, 1, false), "its key's largest accepted body")
	assert.EqualValues(t, 16<<10, send(b, 1, false), "another key: unknown_size, not the first one's 2 MiB")
}

// TestGRPCEstimateNotFromRefusedCalls: a call whose message arrived but
// that an interceptor refused (an authenticator; here one that refuses
// everything) teaches nothing: grpc-go reports the message's size before
// any interceptor runs.
func TestGRPCEstimateNotFromRefusedCalls(t *testing.T) {
	deny := func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
		return nil, status.Error(codes.Unauthenticated, "no")
	}
	f := newGRPCFixtureOn(t, newAdm(t, 1<<30), grpc.ChainUnaryInterceptor(deny))
	for range 3 {
		assert.Equal(t, codes.Unauthenticated, status.Code(f.export(context.Background())))
	}
	f.requireReleased(t)
	assert.EqualValues(t, admission.DefaultUnknownSize, f.tapEstimate(t, traceExport, "127.0.0.1"))
}

// withHeaderKey keys requests by the tenant header X-Tenant.
func withHeaderKey() admOption {
	return withFairness(func(c *admission.FairnessConfig) { c.Key, c.Header = admission.KeyHeader, "X-Tenant" })
}

// tenant sets req's tenant header.
func tenant(req *http.Request, v string) *http.Request {
	req.Header.Set("X-Tenant", v)
	return req
}

// TestHTTPHeaderKeyNested: with the key a tenant header, each tenant of an
// address has its part of the address's share, so that a client choosing
// its own header values gains nothing by rotating them: while another
// address sends too, its address holds at most its fair share whatever the
// values, and a third address is admitted.
func TestHTTPHeaderKeyNested(t *testing.T) {
	const budget = 400 << 10
	const quarter = budget / 4
	f := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(budget), withHeaderKey())
	const a = "10.0.0.1:1"
	// The other address reads first: a is never alone at a recount of the
	// shares (alone, it would be every client).
	defer heldRequests(t, f, tenant(post("/v1/traces", "10.0.0.2:1", 1<<10), "t1"))()
	defer heldRequests(t, f, tenant(post("/v1/traces", a, quarter), "t1"), tenant(post("/v1/traces", a, quarter), "t2"))()
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, tenant(post("/v1/traces", a, 1), "t1")).Code, "t1 holds its part")
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, tenant(post("/v1/traces", a, 1), "t3")).Code, "a new value: the address holds its share")
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, post("/v1/traces", a, 1)).Code, "no value: the address's key")
	assert.Equal(t, http.StatusOK, serve(f.h, tenant(post("/v1/traces", "10.0.0.3:1", 1), "t3")).Code, "another address")
	assert.EqualValues(t, 3, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyBudget))
}

// TestHTTPHeaderKeyOneOrigin: behind a proxy every client has the
// proxy's address: with the key a tenant header and nobody else sending,
// the proxy's tenants share the whole budget, each up to the configured
// share of it, instead of the address's share.
func TestHTTPHeaderKeyOneOrigin(t *testing.T) {
	const budget = 400 << 10
	const quarter = budget / 4
	f := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(budget), withHeaderKey())
	const proxy = "10.0.0.1:1"
	defer heldRequests(t, f, tenant(post("/v1/traces", proxy, quarter), "t1"), tenant(post("/v1/traces", proxy, quarter), "t2"))()
	// Once the shares are counted with the proxy reading, alone.
	require.Eventually(t, func() bool { return serve(f.h, tenant(post("/v1/traces", proxy, quarter), "t1")).Code == http.StatusOK },
		admissionWait, 10*time.Millisecond, "t1 grows beyond a quarter, the proxy beyond its share of 1/2")
	defer heldRequests(t, f, tenant(post("/v1/traces", proxy, quarter), "t1"))()
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, tenant(post("/v1/traces", proxy, 1), "t1")).Code, "t1 holds its share")
	release := heldRequests(t, f, tenant(post("/v1/traces", proxy, quarter), "t3"))
	assert.EqualValues(t, budget, f.stats().Reserved, "the proxy's tenants hold the whole budget")
	release()
}

// TestGRPCHeaderKeyNested is TestHTTPHeaderKeyNested for gRPC metadata: a
// silent stream holds what its message may decode to, within its tenant's
// part of its address's share.
func TestGRPCHeaderKeyNested(t *testing.T) {
	const budget = 256 << 10
	const part = budget / 4 // share 0.5 of the address's fair share 0.5
	f := newGRPCFixture(t, budget, withDefaultShare(), withUnknownSize(1<<10), withHeaderKey())
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	of := func(v string) context.Context { return metadata.AppendToOutgoingContext(ctx, "x-tenant", v) }
	silent := func(ctx context.Context, cc *grpc.ClientConn) grpc.ClientStream {
		cs, err := cc.NewStream(ctx, &pushDesc.Streams[0], pushMethod)
		require.NoError(t, err)
		return cs
	}
	silent(of("t1"), grpcConnFrom(t, f.addr, "127.0.0.2"))
	require.Eventually(t, func() bool { return f.stats().Reserved == part }, admissionWait, time.Millisecond)
	silent(of("t1"), f.conn)
	require.Eventually(t, func() bool { return f.stats().Reserved == 2*part }, admissionWait, time.Millisecond)
	silent(of("t2"), f.conn)
	require.Eventually(t, func() bool { return f.stats().Reserved == 3*part }, admissionWait, time.Millisecond)
	requireRetryable(t, silent(of("t1"), f.conn).RecvMsg(new(emptypb.Empty)), "budget", grpcRetryLow)
	requireRetryable(t, silent(of("t3"), f.conn).RecvMsg(new(emptypb.Empty)), "budget", grpcRetryLow)
	require.NoError(t, f.pushAllOn(of("t3"), grpcConnFrom(t, f.addr, "127.0.0.3"), 1, 10), "another address")
	cancel()
	f.requireReleased(t)
}

// subject is the authenticated client of an authenticator that names its
// subject.
type subject string

func (s subject) GetAttribute(name string) any {
	if name == "subject" {
		return string(s)
	}
	return nil
}

func (subject) GetAttributeNames() []string { return []string{"subject"} }

// TestHTTPAuthKey: with the key an attribute of the authenticated client
// (confighttp's authenticator runs before the middleware), each subject
// has a share of its own, whatever address it comes from.
func TestHTTPAuthKey(t *testing.T) {
	const budget = 400 << 10
	f := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(budget),
		withFairness(func(c *admission.FairnessConfig) { c.Key, c.AuthAttribute = admission.KeyAuth, "subject" }))
	as := func(req *http.Request, s subject) *http.Request {
		return req.WithContext(client.NewContext(req.Context(), client.Info{Auth: s}))
	}
	const addr = "10.0.0.1:1"
	defer heldRequests(t, f, as(post("/v1/traces", addr, budget/2), "alice"))()
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, as(post("/v1/traces", "10.0.0.2:1", 1), "alice")).Code, "alice holds her share")
	assert.Equal(t, http.StatusOK, serve(f.h, as(post("/v1/traces", addr, 1), "bob")).Code, "bob, from the same address")
}

// TestHTTPForwardedKey: behind a trusted proxy, requests are keyed by the
// client address it forwards (the last address of the chain that is not a
// trusted proxy); from any other address the forwarding headers are
// ignored.
func TestHTTPForwardedKey(t *testing.T) {
	const budget = 400 << 10
	f := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(budget),
		withFairness(func(c *admission.FairnessConfig) { c.TrustedProxies = []string{"127.0.0.0/24"} }))
	const proxy = "127.0.0.1:1"
	via := func(req *http.Request, name, value string) *http.Request {
		req.Header.Set(name, value)
		return req
	}
	defer heldRequests(t, f, via(post("/v1/traces", proxy, budget/2), "X-Forwarded-For", "10.0.0.1"))()
	for _, h := range [][2]string{
		{"X-Forwarded-For", "10.0.0.1"},
		{"X-Forwarded-For", "192.0.2.7, 10.0.0.1, 127.0.0.5"},
	} {
		assert.Equal(t, http.StatusTooManyRequests, serve(f.h, via(post("/v1/traces", proxy, 1), h[0], h[1])).Code, "%s: %s", h[0], h[1])
	}
	assert.Equal(t, http.StatusOK, serve(f.h, via(post("/v1/traces", proxy, 1), "X-Forwarded-For", "10.0.0.2")).Code, "another client behind the proxy")
	assert.Equal(t, http.StatusOK, serve(f.h, post("/v1/traces", proxy, 1)).Code, "the proxy's own key")
	assert.Equal(t, http.StatusOK, serve(f.h, via(post("/v1/traces", "10.0.0.9:1", 1), "X-Forwarded-For", "10.0.0.1")).Code,
		"an untrusted address cannot claim another's key")

	// A proxy that sets Forwarded: its for= is the client's address.
	g := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(budget),
		withFairness(func(c *admission.FairnessConfig) {
			c.TrustedProxies, c.ForwardedHeader = []string{"127.0.0.0/24"}, "Forwarded"
		}))
	defer heldRequests(t, g, via(post("/v1/traces", proxy, budget/2), "Forwarded", `for="10.0.0.1:4711"`))()
	assert.Equal(t, http.StatusTooManyRequests, serve(g.h, via(post("/v1/traces", proxy, 1), "Forwarded", "for=10.0.0.1")).Code)
	assert.Equal(t, http.StatusOK, serve(g.h, via(post("/v1/traces", proxy, 1), "Forwarded", "for=10.0.0.2")).Code, "another client behind the proxy")
}

// TestHTTPFairDrops: while a signal sheds, the keys that send more than
// their fair share of the requests are dropped first: nine quiet keys and
// a tenth sending ten times as much, with 30% to shed, the quiet keys are
// not refused once the drops follow the arrivals, and the loud one loses
// about what is shed of all.
func TestHTTPFairDrops(t *testing.T) {
	f := newHTTPFixture(t, 0)
	f.dec.setDrop(decision.SignalTraces, 0.3)
	round := func() (quiet, loud int) {
		for i := range 9 {
			if serve(f.h, post("/v1/traces", fmt.Sprintf("127.0.1.%d:1", 1+i), 0)).Code != http.StatusOK {
				quiet++
			}
		}
		for range 10 {
			if serve(f.h, post("/v1/traces", "127.0.2.1:1", 0)).Code != http.StatusOK {
				loud++
			}
		}
		return quiet, loud
	}
	// Until the drops are computed from the arrivals (a few recounts),
	// every key is dropped with the signal's probability.
	for start := time.Now(); time.Since(start) < 600*time.Millisecond; {
		round()
	}
	var quiet, loud int
	const rounds = 200
	for range rounds {
		q, l := round()
		quiet, loud = quiet+q, loud+l
	}
	t.Logf("refused: quiet %d of %d, loud %d of %d", quiet, 9*rounds, loud, 10*rounds)
	assert.Zero(t, quiet, "the quiet keys are under their fair share")
	assert.InDelta(t, 0.57, float64(loud)/(10*rounds), 0.1, "the loud key's excess: 1 - 4.3/10")
}

// TestHoldKeyPlaces: one key holds at most its share of the hold's places,
// so a key flooding the hold leaves room for the others.
func TestHoldKeyPlaces(t *testing.T) {
	f := newHTTPFixture(t, 0, withDefaultShare(), withHold(admissionWait, 4))
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	ctx, cancel := context.WithCancel(context.Background())
	answers := make(chan int, 3)
	heldFrom := func(remote string) {
		req := post("/v1/traces", remote, 10).WithContext(ctx)
		go func() { answers <- serve(f.h, req).Code }()
	}
	heldFrom("10.0.0.1:1")
	heldFrom("10.0.0.1:2")
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 2 }, admissionWait, time.Millisecond)
	assert.Equal(t, http.StatusTooManyRequests, serve(f.h, post("/v1/traces", "10.0.0.1:3", 10)).Code,
		"the key holds its share of the places: refused at once")
	heldFrom("10.0.0.2:1")
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 3 }, admissionWait, time.Millisecond, "another key is held")
	cancel()
	for range 3 {
		assert.Equal(t, http.StatusTooManyRequests, <-answers)
	}
	assert.Zero(t, f.stats().HeldRequests)
	assert.Zero(t, f.next.calls.Load())
}

// TestHTTPUnclassifiedReported: a request no route matches is let through
// untouched, but reported, so that a receiver serving a custom path
// without a matching route does not leave the throttle a silent no-op.
func TestHTTPUnclassifiedReported(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	f := newHTTPFixture(t, 1<<20, withMiddleware(func(c *Config) {
		c.Unclassified = func(p admission.Protocol, path string) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, p.String()+" "+path)
		}
	}))
	f.dec.setAll(decision.VerdictDenyOpen)
	assert.Equal(t, http.StatusOK, serve(f.h, post("/custom/traces", "192.0.2.1:1", 1)).Code)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"http /custom/traces"}, seen)
}

// TestInflightCounts: the admitted, unfinished requests are counted over
// HTTP and gRPC (the demand signal sets the held ones against them); held
// or refused ones are not.
func TestInflightCounts(t *testing.T) {
	a := newAdm(t, 1<<20, withHold(admissionWait, 8))
	f := newHTTPFixtureOn(t, a)
	entered, hold := make(chan struct{}), make(chan struct{})
	h := f.mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		entered <- struct{}{}
		<-hold
	}))
	go h.ServeHTTP(httptest.NewRecorder(), post("/v1/traces", "192.0.2.1:1", 1))
	<-entered
	assert.EqualValues(t, 1, a.stats().Inflight)
	f.dec.set(decision.SignalLogs, decision.VerdictDenyOpen)
	ctx, cancel := context.WithCancel(context.Background())
	heldDone := make(chan int, 1)
	go func() { heldDone <- serve(f.h, post("/v1/logs", "192.0.2.1:1", 1).WithContext(ctx)).Code }()
	require.Eventually(t, func() bool { return a.stats().HeldRequests == 1 }, admissionWait, time.Millisecond)
	assert.EqualValues(t, 1, a.stats().Inflight, "a held request is not in flight")
	cancel()
	assert.Equal(t, http.StatusTooManyRequests, <-heldDone)
	assert.EqualValues(t, 1, a.stats().Inflight, "a refusal is not in flight")
	close(hold)
	require.Eventually(t, func() bool { return a.stats().Inflight == 0 }, admissionWait, time.Millisecond)

	f.dec.set(decision.SignalLogs, decision.VerdictAdmit)
	g := newGRPCFixtureOn(t, a)
	g.push.hold = make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- g.pushAll(context.Background(), 1, 10) }()
	require.Eventually(t, func() bool { return g.push.messages.Load() == 1 }, admissionWait, time.Millisecond)
	assert.EqualValues(t, 1, a.stats().Inflight)
	close(g.push.hold)
	require.NoError(t, <-errc)
	a.requireReleased(t)
}

// TestHTTPForwardedNotChosenByClient: behind a trusted proxy that adds
// X-Forwarded-For (HAProxy's option forwardfor, nginx's
// $proxy_add_x_forwarded_for), a client's own Forwarded header reaches the
// collector unchanged: it must not choose the client's key, or a client
// naming a new address in every request would escape its share.
func TestHTTPForwardedNotChosenByClient(t *testing.T) {
	const budget = 400 << 10
	f := newHTTPFixture(t, budget, withDefaultShare(), withUnknownSize(budget),
		withFairness(func(c *admission.FairnessConfig) { c.TrustedProxies = []string{"127.0.0.0/24"} }))
	const proxy = "127.0.0.1:1"
	forged := func(n, i int) *http.Request {
		req := post("/v1/traces", proxy, n)
		req.Header.Set("Forwarded", fmt.Sprintf("for=10.9.0.%d", i))
		req.Header.Set("X-Forwarded-For", "10.0.0.1") // the proxy's
		return req
	}
	defer heldRequests(t, f, forged(budget/2, 1))()
	for i := 2; i < 5; i++ {
		assert.Equal(t, http.StatusTooManyRequests, serve(f.h, forged(1, i)).Code, "a forged Forwarded: the client at its share")
	}
}
