// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// countingBody counts the bytes read from it.
type countingBody struct {
	r    io.Reader
	read atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error { return nil }

func pacedRequest(ctx context.Context, size int) (*http.Request, *countingBody) {
	body := &countingBody{r: bytes.NewReader(make([]byte, size))}
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/traces", body)
	r.ContentLength = int64(size)
	return r, body
}

// holdAsync runs p.Hold(r) in a goroutine and returns a channel closed when
// it returns.
func holdAsync(p *Tarpit, r *http.Request) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Hold(r)
	}()
	return done
}

func TestNewTarpitOff(t *testing.T) {
	assert.Nil(t, NewTarpit(0, 10, nil), "no delay")
	assert.Nil(t, NewTarpit(time.Second, 0, nil), "no room")
	var p *Tarpit
	r, body := pacedRequest(context.Background(), 100)
	assert.False(t, p.Hold(r)) // nil-safe, reads nothing
	assert.Zero(t, body.read.Load())
	assert.Zero(t, p.Held())
}

// TestTarpitHolds: a held rejection has had its body read and discarded, is
// counted in Held while it waits, and ends with the request's context (the
// client went away) without waiting for the rest of the delay.
func TestTarpitHolds(t *testing.T) {
	p := NewTarpit(time.Hour, 4, nil)
	ctx, cancel := context.WithCancel(context.Background())
	const size = 200 << 10
	r, body := pacedRequest(ctx, size)
	done := holdAsync(p, r)

	require.Eventually(t, func() bool { return p.Held() == 1 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return body.read.Load() == size }, 10*time.Second, time.Millisecond,
		"the body is read before the wait, so neither the heap nor the socket buffers keep it")
	select {
	case <-done:
		t.Fatal("returned before the delay or the context's end")
	default:
	}
	cancel()
	<-done
	assert.Zero(t, p.Held())
}

// TestTarpitDelayEnds: without the context ending, Hold returns after the
// delay (a short one here; no upper bound is asserted).
func TestTarpitDelayEnds(t *testing.T) {
	p := NewTarpit(20*time.Millisecond, 1, nil)
	r, body := pacedRequest(context.Background(), 1000)
	start := time.Now()
	assert.True(t, p.Hold(r), "the body was read")
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	assert.EqualValues(t, 1000, body.read.Load())
	assert.Zero(t, p.Held())
}

// TestTarpitAnswersAtOnce lists what is never held: requests beyond
// max_held, bodies over MaxTarpitBody or of unknown length, no body. None of
// them is read.
func TestTarpitAnswersAtOnce(t *testing.T) {
	p := NewTarpit(time.Hour, 1, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, _ := pacedRequest(ctx, 10)
	firstDone := holdAsync(p, first)
	require.Eventually(t, func() bool { return p.Held() == 1 }, 10*time.Second, time.Millisecond)

	full, fullBody := pacedRequest(context.Background(), 10)
	assert.False(t, p.Hold(full)) // max_held reached: returns at once (the test would hang otherwise)
	assert.Zero(t, fullBody.read.Load(), "beyond max_held")
	cancel()
	<-firstDone

	p = NewTarpit(time.Hour, 10, nil)
	big, bigBody := pacedRequest(context.Background(), MaxTarpitBody+1)
	assert.False(t, p.Hold(big))
	assert.Zero(t, bigBody.read.Load(), "over MaxTarpitBody: net/http closes rather than drains it")

	unknown, unknownBody := pacedRequest(context.Background(), 10)
	unknown.ContentLength = -1
	assert.False(t, p.Hold(unknown))
	assert.Zero(t, unknownBody.read.Load(), "unknown length: may be a decompressing reader")

	none := httptest.NewRequest(http.MethodPost, "/v1/traces", http.NoBody)
	assert.False(t, p.Hold(none))
	assert.Zero(t, p.Held())
}

// TestTarpitExpectContinue: a client waiting for "100 Continue" has not sent
// its body; it is answered at once, without asking for the body.
func TestTarpitExpectContinue(t *testing.T) {
	p := NewTarpit(time.Hour, 1, nil)
	r := httptest.NewRequest(http.MethodPost, "/v1/traces", &failingBody{t: t})
	r.ContentLength = 1000
	r.Header.Set("Expect", "100-continue")
	p.Hold(r) // would hang for an hour if held
	assert.Zero(t, p.Held())
}

// TestHTTPTarpitRejection runs the middleware on a real server: a shed
// request is answered 429 only after its hold (it is counted as held while
// the client waits), an Open one at once, and a held client that gives up
// frees its place.
func TestHTTPTarpitRejection(t *testing.T) {
	p := NewTarpit(time.Hour, 8, nil)
	f := newHTTPFixture(t, 0, withMiddleware(func(c *Config) { c.Tarpit = p }))
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	c := srv.Client()
	post := func(ctx context.Context) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/traces", bytes.NewReader(make([]byte, 100<<10)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-protobuf")
		return c.Do(req)
	}

	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		resp, err := post(ctx)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	require.Eventually(t, func() bool { return p.Held() == 1 }, 10*time.Second, time.Millisecond, "shed: held")
	select {
	case err := <-errc:
		t.Fatalf("the shed request was answered while held: %v", err)
	default:
	}

	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	resp, err := post(context.Background())
	require.NoError(t, err, "Open: answered at once, while the other is still held")
	resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.EqualValues(t, 1, p.Held())

	cancel()
	require.Error(t, <-errc, "the client gave up")
	require.Eventually(t, func() bool { return p.Held() == 0 }, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 1, f.rec.get(protoHTTP, decision.SignalTraces, decision.VerdictDenyShed))
	assert.Zero(t, f.next.calls.Load())
}

// TestTarpitClosing: when the receivers start to stop, every held
// rejection is answered at once.
func TestTarpitClosing(t *testing.T) {
	closing := make(chan struct{})
	p := NewTarpit(time.Hour, 1, closing)
	r, _ := pacedRequest(context.Background(), 10)
	done := holdAsync(p, r)
	require.Eventually(t, func() bool { return p.Held() == 1 }, 10*time.Second, time.Millisecond)
	close(closing)
	<-done // would wait an hour
	assert.Zero(t, p.Held())
}
