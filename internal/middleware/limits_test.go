// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

// The edges of the limits: the exempt signals' reserve, a key's room for a
// first reservation, an exempt body past its key's limit, the lane beside
// the budget's peak, and a waiting call admitted whatever its share.

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// oneByteFirst reads a body's first byte alone, then the rest, and
// answers as otlpreceiver does; the size of the first read does not then
// decide what the body reserves first.
func oneByteFirst(f *httpFixture) http.Handler {
	return f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := r.Body.Read(make([]byte, 1))
		if err == nil {
			var m int64
			m, err = io.Copy(io.Discard, r.Body)
			n += int(m)
		}
		f.next.read.Add(int64(n))
		if err != nil && !errors.Is(err, io.EOF) {
			writeReadError(w, err)
		}
	}))
}

// TestHTTPExemptReserveLargeBody: with a signal exempt, the others may use
// three quarters of the budget; a body that may hold the whole budget (no
// per-key limit, share 1) and is larger than three quarters of it is
// refused at its first byte, alone, for ever (its first reservation is
// capped at the budget, not at what it may take of it), instead of reading
// its three quarters and the rest in the oversize lane.
func TestHTTPExemptReserveLargeBody(t *testing.T) {
	f := newHTTPFixture(t, 1000, withExempt(decision.SignalMetrics))
	h := oneByteFirst(f)
	for range 3 {
		assert.Equal(t, http.StatusOK, serve(h, post("/v1/traces", "192.0.2.1:1", 900)).Code, "alone, with the budget empty")
	}
}

// TestGRPCExemptReserveCallSize: the same for gRPC: with a signal exempt
// and share 1, a call of another signal reserves at its start what its
// message may decode to, capped at the budget, not at the three quarters
// it may take: with a budget under 4/3 of grpc_max_message_size no call
// of a signal that is not exempt is ever admitted.
func TestGRPCExemptReserveCallSize(t *testing.T) {
	f := newGRPCFixture(t, 1<<20, withExempt(decision.SignalLogs), withUnknownSize(4<<10))
	require.NoError(t, f.export(context.Background()), "alone, with the budget empty")
	f.requireReleased(t)
}

// TestGRPCWaitingCallAdmitted: a call of a key that holds nothing waits for
// what its message may decode to while two other keys fill the budget, and
// is admitted when one of them lets go, whatever its own share (a third of
// the budget once three keys are active).
func TestGRPCWaitingCallAdmitted(t *testing.T) {
	const budget = 256 << 10
	f := newGRPCFixture(t, budget, withDefaultShare(), withUnknownSize(1<<10), withHold(admissionWait, 8))
	ctx, cancel := context.WithTimeout(context.Background(), admissionWait)
	defer cancel()
	aCtx, releaseA := context.WithCancel(ctx)
	for i, from := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"} {
		sctx := ctx
		if from == "127.0.0.2" {
			sctx = aCtx
		}
		_, err := grpcConnFrom(t, f.addr, from).NewStream(sctx, &pushDesc.Streams[0], pushMethod)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return f.stats().Reserved == int64(i+1)*callSize(budget) }, admissionWait, time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // the next request computes the shares again, with both active

	callCtx, cancelCall := context.WithTimeout(ctx, 3*time.Second)
	defer cancelCall()
	cc := grpcConnFrom(t, f.addr, "127.0.0.4")
	errc := make(chan error, 1)
	go func() { errc <- exportOn(callCtx, cc) }()
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 1 }, admissionWait, time.Millisecond, "the call waits")
	releaseA()
	require.NoError(t, <-errc, "the waiting call is admitted")
}

// TestHTTPFirstReservationWithinRoom: a body's first reservation is capped
// at its key's room, but then raised to what the handler's first read asks
// for (up to 64 KiB): a body alone, larger than a budget of 16 KiB, read
// with a 32 KiB buffer, is refused at its first byte for ever instead of
// reading in the oversize lane.
func TestHTTPFirstReservationWithinRoom(t *testing.T) {
	f := newHTTPFixture(t, 16<<10, withUnknownSize(4<<10))
	h := f.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, r.Body, make([]byte, 32<<10))
		f.next.read.Add(n)
		if err != nil {
			writeReadError(w, err)
		}
	}))
	assert.Equal(t, http.StatusOK, serve(h, chunkedTraces("192.0.2.1:1", 40<<10)).Code, "alone, with the budget empty")
	assert.EqualValues(t, 40<<10, f.next.read.Load())
}

// TestHTTPExemptBodyGrowsPastKeyLimit: an exempt request may take its
// key's limit over by a quarter of the budget; a body of known small
// length does (TestHTTPExemptKeyExtra), but one that grows as it is read
// (chunked, compressed) grows only to the key's limit, waits, and is cut
// off with a 429.
func TestHTTPExemptBodyGrowsPastKeyLimit(t *testing.T) {
	const budget = 1 << 20
	f := newHTTPFixture(t, budget, withDefaultShare(), withExempt(decision.SignalMetrics),
		withUnknownSize(64<<10), withWait(100*time.Millisecond))
	defer f.reserve(t, "10.0.0.1", decision.SignalMetrics, budget/2)()
	req := chunkedTraces("10.0.0.1:1", 100<<10)
	req.URL.Path = "/v1/metrics"
	assert.Equal(t, http.StatusOK, serve(f.h, req).Code, "within a quarter of the budget over its key's limit")
}

// TestHTTPPeakCountsLane: Stats.Peak is the most Stats.Reserved has been,
// the oversize lane's bodies included; it leaves them out.
func TestHTTPPeakCountsLane(t *testing.T) {
	f := newHTTPFixture(t, 16<<10, withUnknownSize(4<<10))
	var seen int64
	h := f.mw.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1<<10)
		for {
			_, err := r.Body.Read(buf)
			seen = max(seen, f.stats().Reserved)
			if err != nil {
				return
			}
		}
	}))
	assert.Equal(t, http.StatusOK, serve(h, chunkedTraces("192.0.2.1:1", 100<<10)).Code)
	assert.Greater(t, seen, int64(16<<10), "the lane's bytes are in Reserved")
	assert.EqualValues(t, 16<<10, f.stats().Peak, "the budget's peak: never past it, the lane apart")
}
