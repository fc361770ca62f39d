// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

// The waits of growing bodies for one another (budget.waitGrow): who gives
// up when they can no longer all be served.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// body admits req and reads its body, fed through a pipe, with a read
// buffer of bufSize on its own goroutine until it ends (done). Its pipe is
// closed and its ticket released when the test ends.
func (f *fixture) body(t *testing.T, req Request, bufSize int) *pipedBody {
	t.Helper()
	tk, v := f.c.Admit(context.Background(), req)
	require.True(t, v.Admitted())
	tk.Start(context.Background(), nil, false)
	pr, pw := io.Pipe()
	b := &pipedBody{tk: tk, pr: pr, pw: pw, done: make(chan error, 1)}
	go func() {
		buf := make([]byte, bufSize)
		for {
			if _, err := tk.Read(pr, buf); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				b.done <- err
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = pr.Close()
		_ = pw.Close()
		tk.Release(false)
	})
	return b
}

// feed writes n bytes to b and waits until b has read them.
func feed(t *testing.T, b *pipedBody, n int) {
	t.Helper()
	done := make(chan struct{})
	go func() { _, _ = b.pw.Write(make([]byte, n)); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the body did not read %d bytes", n)
	}
}

// feedAndClose writes n more bytes to b, then ends it, on its own goroutine.
func feedAndClose(b *pipedBody, n int) {
	go func() { _, _ = b.pw.Write(make([]byte, n)); _ = b.pw.Close() }()
}

// waitQueued waits until b waits to grow (or has ended).
func waitQueued(t *testing.T, f *fixture, b *pipedBody) {
	t.Helper()
	queued := func() bool {
		f.c.budget.mu.Lock()
		defer f.c.budget.mu.Unlock()
		return slices.Contains(f.c.budget.queue, &b.tk.w)
	}
	require.Eventually(t, func() bool { return queued() || len(b.done) > 0 }, 10*time.Second, time.Millisecond)
}

// client is the address the requests of these tests come from: behind a
// proxy, every tenant's.
const client = "10.0.0.1"

// httpReq is an HTTP request of sig from client.
func httpReq(sig decision.Signal, length int64) Request {
	return Request{Protocol: ProtocolHTTP, Signal: sig, Remote: addr(client), Length: length}
}

// tenantFixture is a controller of a 1 MiB budget keyed by the x-tenant
// header under the address, and another client (other) holding 100 KiB of
// it: client may hold half the budget, each of its tenants a quarter.
func tenantFixture(t *testing.T) (f *fixture, other Key) {
	t.Helper()
	f = newFixture(t, 1<<20, func(c *Config, _ *HoldConfig) {
		c.Fairness.Key, c.Fairness.Header = KeyHeader, "X-Tenant"
		c.WaitTimeout = time.Minute
	})
	other = f.c.keys.key(addr("10.0.0.9"), "")
	f.c.budget.charge(100<<10, other)
	return f, other
}

// requireTenantLimits counts the shares again and checks those
// tenantFixture promises for tenant key k.
func requireTenantLimits(t *testing.T, f *fixture, k Key) {
	t.Helper()
	f.c.keys.recount(now(), nil)
	lim, plim := f.c.budget.limitOf(k, now())
	require.EqualValues(t, 256<<10, lim, "a tenant's limit")
	require.EqualValues(t, 512<<10, plim, "the address's limit")
}

// tenantReq is an HTTP request of tenant from client.
func tenantReq(tenant string, length int64) Request {
	r := httpReq(decision.SignalTraces, length)
	r.Header = http.Header{"X-Tenant": {tenant}}
	return r
}

// TestBodiesOfOneKeyDoNotWaitForEachOther: when the bodies of one key hold
// its whole share between them and each waits for more, nothing else of
// that key gives bytes back: the youngest gives up at once and the older
// ones read on, rather than all of them waiting until the oldest's wait
// runs out while every new body of the key is refused. Behind a proxy every
// client is that one key.
func TestBodiesOfOneKeyDoNotWaitForEachOther(t *testing.T) {
	const size = 1 << 20 // a key's share: 512 KiB
	f := newFixture(t, size, func(c *Config, _ *HoldConfig) { c.WaitTimeout = time.Minute })
	k := f.c.keys.key(addr(client), "")
	f.c.keys.learn(k, decision.SignalTraces, 200<<10, now(), false)
	// Three bodies take 200 KiB, 200 KiB and the 112 KiB left of the
	// share; the youngest waits for more.
	a, b, c := f.pipedBody(t, client), f.pipedBody(t, client), f.pipedBody(t, client)
	_, _ = a.pw.Write(make([]byte, 200<<10))
	_, _ = b.pw.Write(make([]byte, 200<<10))
	go func() { _, _ = c.pw.Write(make([]byte, 200<<10)) }()
	require.Eventually(t, func() bool { return f.c.budget.waiting.Load() == 1 }, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 512<<10, f.c.Stats().Reserved, "the key's share")
	// The two older ones want more as well, which fits once the youngest
	// has given its bytes back.
	for _, body := range []*pipedBody{a, b} {
		go func() { _, _ = body.pw.Write(make([]byte, 40<<10)); _ = body.pw.Close() }()
	}
	select {
	case err := <-c.done:
		require.ErrorIs(t, err, ErrBudget, "the youngest body")
	case <-time.After(10 * time.Second):
		t.Fatalf("no body gave up: the key's bodies wait for one another")
	}
	assert.Equal(t, 1, f.rec.cut(ProtocolHTTP, CutBudget), "admitted at its first bytes, then cut off")
	_ = c.pr.Close() // a refused body's writer stops
	c.tk.Release(false)
	for _, body := range []*pipedBody{a, b} {
		require.NoError(t, <-body.done, "an older body reads on")
		body.tk.Release(true)
	}
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestYoungerBodyOfAKeyMayGoFirst: within a key's share a younger body may
// be served before an older one, so an older body needing more than its
// key has free is no reason for a younger one to give up: a body 4 KiB from
// its end, whose key is about to give back 24 KiB (a request that is not
// waiting), reads to its end, and the older body after it.
func TestYoungerBodyOfAKeyMayGoFirst(t *testing.T) {
	const size = 1 << 20 // a key's share: 512 KiB
	f := newFixture(t, size, func(c *Config, _ *HoldConfig) { c.WaitTimeout = time.Minute })
	k := f.c.keys.key(addr(client), "")
	f.c.keys.learn(k, decision.SignalTraces, 472<<10, now(), false)
	older := f.body(t, httpReq(decision.SignalTraces, -1), 32<<10)
	younger := f.body(t, httpReq(decision.SignalTraces, 20<<10), 32<<10)

	feed(t, older, 472<<10)      // holds 472 KiB
	f.c.budget.charge(24<<10, k) // another request of the key, not waiting (reading, or a gRPC decode)
	feed(t, younger, 16<<10)     // holds the 16 KiB left of the share
	require.EqualValues(t, 512<<10, f.c.keys.slot(k).reserved.Load(), "the key's share")
	feedAndClose(younger, 4<<10) // its last 4 KiB: it waits
	waitQueued(t, f, younger)
	feedAndClose(older, 32<<10) // 32 KiB more: it waits too, ahead of the younger
	waitQueued(t, f, older)
	time.Sleep(100 * time.Millisecond) // every waiter has looked at its line

	f.c.budget.release(24<<10, k) // the other request ends: 24 KiB of the share are free
	select {
	case err := <-younger.done:
		require.NoError(t, err, "a body 4 KiB from its end, refused although its key was about to give back 24 KiB")
	case <-time.After(10 * time.Second):
		t.Fatal("the younger body neither read on nor gave up")
	}
	younger.tk.Release(true)
	require.NoError(t, <-older.done, "the older body, once the younger ended")
	older.tk.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestTenantDoesNotGiveUpForItsSiblings: behind one address (key: a tenant
// header) the bodies of two tenants wait for more while a third tenant's
// request, not waiting, is about to end: a fourth tenant's body that needs
// its last 4 KiB does not give up for them, and all of them read on.
func TestTenantDoesNotGiveUpForItsSiblings(t *testing.T) {
	f, other := tenantFixture(t)
	kt := f.c.keys
	evil1 := f.body(t, tenantReq("evil-1", -1), 32<<10)
	evil2 := f.body(t, tenantReq("evil-2", -1), 32<<10)
	good := f.body(t, tenantReq("good", 100<<10), 32<<10)
	kE1, kE2, kG, kN := kt.key(addr(client), "evil-1"), kt.key(addr(client), "evil-2"), kt.key(addr(client), "good"), kt.key(addr(client), "third")
	origin := kt.parentOf(kG)
	require.NotZero(t, origin)
	kt.learn(kE1, decision.SignalTraces, 200<<10, now(), false)
	kt.learn(kE2, decision.SignalTraces, 200<<10, now(), false)
	kt.learn(kG, decision.SignalTraces, 96<<10, now(), false)
	requireTenantLimits(t, f, kG)

	feed(t, evil1, 200<<10)
	feed(t, evil2, 200<<10)
	feed(t, good, 96<<10)
	f.c.budget.charge(16<<10, kN) // a third tenant's request, not waiting, about to end
	require.EqualValues(t, 512<<10, kt.slot(origin).reserved.Load(), "the proxy's limit is full")
	feedAndClose(good, 4<<10) // its last 4 KiB: it waits
	waitQueued(t, f, good)
	feedAndClose(evil1, 32<<10)
	waitQueued(t, f, evil1)
	feedAndClose(evil2, 32<<10)
	waitQueued(t, f, evil2)
	time.Sleep(100 * time.Millisecond)
	assert.False(t, kt.contended(now()), "the budget was never short")

	f.c.budget.release(16<<10, kN) // the third tenant's request ends
	select {
	case err := <-good.done:
		require.NoError(t, err, "a tenant holding 96 of its 256 KiB, refused for its sibling tenants' older bodies")
	case <-time.After(10 * time.Second):
		t.Fatal("the tenant's body neither read on nor gave up")
	}
	good.tk.Release(true)
	for _, b := range []*pipedBody{evil1, evil2} {
		require.NoError(t, <-b.done)
		b.tk.Release(true)
	}
	f.c.budget.release(100<<10, other)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestBodyDoesNotGiveUpForAnExemptOne: an exempt signal's body may take
// its key's share and the exempt reserve; waiting for the budget, not for
// its key's share, it is no reason for a younger body of its key, with
// room in the share for what it needs, to give up (which would free
// nothing anyone can use): both read on once the budget frees.
func TestBodyDoesNotGiveUpForAnExemptOne(t *testing.T) {
	const size = 1 << 20 // share 512 KiB; 768 KiB for the exempt signal
	f := newFixtureExempt(t, size, []decision.Signal{decision.SignalLogs}, func(c *Config, _ *HoldConfig) { c.WaitTimeout = time.Minute })
	kt := f.c.keys
	k, k2 := kt.key(addr(client), ""), kt.key(addr("10.0.0.2"), "")
	kt.learn(k, decision.SignalLogs, 480<<10, now(), false)
	exempt := f.body(t, httpReq(decision.SignalLogs, -1), 32<<10)
	plain := f.body(t, httpReq(decision.SignalTraces, 20<<10), 16<<10)

	feed(t, exempt, 480<<10)
	feed(t, plain, 16<<10)
	require.EqualValues(t, 496<<10, kt.slot(k).reserved.Load())
	f.c.budget.charge(512<<10, k2) // another key's requests fill the budget
	kt.recount(now(), nil)
	lim, _ := f.c.budget.limitsFor(k, false, now())
	limEx, _ := f.c.budget.limitsFor(k, true, now())
	require.EqualValues(t, 512<<10, lim)
	require.EqualValues(t, 768<<10, limEx)

	feedAndClose(plain, 4<<10) // 4 KiB more: 16 KiB of its share are free, the budget is not
	waitQueued(t, f, plain)
	feedAndClose(exempt, 32<<10) // 32 KiB more: within its 768 KiB, the budget is full
	waitQueued(t, f, exempt)
	time.Sleep(100 * time.Millisecond)

	f.c.budget.release(512<<10, k2) // the other key's requests end
	require.NoError(t, <-exempt.done, "the exempt body")
	exempt.tk.Release(true)
	select {
	case err := <-plain.done:
		require.NoError(t, err, "a body with room in its key's share, refused for an exempt body waiting for the budget")
	case <-time.After(10 * time.Second):
		t.Fatal("the non-exempt body neither read on nor gave up")
	}
	plain.tk.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestLoneBodyWaitsForItsShareToGrowBack: a body that waits because the
// budget is short makes it contended, which shrinks its key's share to a
// fair part below what the body holds. Alone in its key's line it is no
// deadlock: it waits, and reads on once the budget frees and the contention
// has passed, within its wait_timeout, although no request gave anything
// back when the contention passed.
func TestLoneBodyWaitsForItsShareToGrowBack(t *testing.T) {
	const size = 1 << 20
	f := newFixture(t, size, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 5 * time.Second })
	kt := f.c.keys
	k, k2, k3 := kt.key(addr(client), ""), kt.key(addr("10.0.0.2"), ""), kt.key(addr("10.0.0.3"), "")
	kt.learn(k, decision.SignalTraces, 400<<10, now(), false)
	body := f.body(t, httpReq(decision.SignalTraces, -1), 32<<10)
	feed(t, body, 400<<10) // within its 512 KiB share
	f.c.budget.charge(312<<10, k2)
	f.c.budget.charge(312<<10, k3) // the budget is full
	kt.recount(now(), nil)
	require.False(t, kt.contended(now()))
	lim, _ := f.c.budget.limitOf(k, now())
	require.EqualValues(t, 512<<10, lim)

	start := time.Now()
	feedAndClose(body, 32<<10) // 32 KiB more: its share has room, the budget not
	waitQueued(t, f, body)
	time.Sleep(100 * time.Millisecond)
	if len(body.done) > 0 {
		require.NoError(t, <-body.done, "gave up within %v of waiting, alone in its key's line, before the budget even freed", time.Since(start))
	}
	f.c.budget.release(312<<10, k2) // the budget frees; the contention lasts about 2 s more
	select {
	case err := <-body.done:
		require.NoError(t, err, "refused after %v: its key's share grew back while it waited", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("the body neither read on nor gave up")
	}
	body.tk.Release(true)
	f.c.budget.release(312<<10, k3)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestHeaviestTenantGivesUp: when the bodies of an origin's tenants wait
// for one another, none of them able to go on even if everything else of
// the origin finished, the youngest body of the tenant holding the most
// gives up, not the youngest body of all: a tenant holding little does not
// pay for its siblings' large bodies.
func TestHeaviestTenantGivesUp(t *testing.T) {
	f, other := tenantFixture(t)
	kt := f.c.keys
	heavy1 := f.body(t, tenantReq("heavy", -1), 32<<10)
	heavy2 := f.body(t, tenantReq("heavy", -1), 32<<10)
	mid := f.body(t, tenantReq("mid", -1), 32<<10)
	light := f.body(t, tenantReq("light", -1), 32<<10)
	for tenant, n := range map[string]int64{"heavy": 110 << 10, "mid": 200 << 10, "light": 80 << 10} {
		kt.learn(kt.key(addr(client), tenant), decision.SignalTraces, n, now(), false)
	}
	kh := kt.key(addr(client), "heavy")
	requireTenantLimits(t, f, kh)
	feed(t, heavy1, 110<<10)
	feed(t, heavy2, 110<<10)
	feed(t, mid, 200<<10)
	feed(t, light, 80<<10)
	require.EqualValues(t, 500<<10, kt.slot(kt.parentOf(kh)).reserved.Load())
	// Each wants 32 KiB more, within its tenant's limit; 12 KiB of the
	// proxy's are free.
	for _, b := range []*pipedBody{heavy1, heavy2, mid, light} {
		feedAndClose(b, 32<<10)
	}
	select {
	case err := <-heavy2.done:
		require.ErrorIs(t, err, ErrBudget, "the heavy tenant's youngest body")
	case err := <-light.done:
		t.Fatalf("the light tenant's body ended first (%v): it gave up for the heavy tenant", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no body gave up: the proxy's bodies wait for one another")
	}
	heavy2.tk.Release(false)
	for _, b := range []*pipedBody{heavy1, mid, light} {
		require.NoError(t, <-b.done, "the others read on")
		b.tk.Release(true)
	}
	f.c.budget.release(100<<10, other)
	assert.Zero(t, f.c.Stats().Reserved)
}
