// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// newObserveFixture is newFixture with observe_only on.
func newObserveFixture(t *testing.T, size int64) *fixture {
	t.Helper()
	cfg := NewDefaultConfig()
	cfg.MaxInflightBytes = FixedInflightBudget(ByteSize(size))
	cfg.UnknownSize = 16 << 10
	f := &fixture{dec: &fakeDecider{}, rec: &counts{}}
	c, err := New(cfg, HoldConfig{}, Settings{Decider: f.dec, Recorder: f.rec, ObserveOnly: true, Budget: size, HeldPool: size})
	require.NoError(t, err)
	f.c = c
	t.Cleanup(c.Close)
	return f
}

// TestCutOffBodyReadsNothingMore: an HTTP body cut off at shutdown before
// its first bytes were reserved reads nothing more, also what net/http has
// buffered (a read deadline in the past fails no read of it): it is
// counted allowed and cut off, never refused at its first bytes as well.
func TestCutOffBodyReadsNothingMore(t *testing.T) {
	const size = 1 << 20
	f := newFixture(t, size, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 10 * time.Second })
	f.c.shutdownGrace = 10 * time.Millisecond
	other := f.c.keys.key(addr("10.0.0.1"), "")
	f.c.budget.charge(size, other) // another key holds the whole budget
	t.Cleanup(func() { f.c.budget.release(size, other) })

	tk, v := f.http(t, "10.0.0.3", -1)
	require.True(t, v.Admitted())
	require.NotNil(t, tk)
	// Like httpBody.Stall with the first bytes already buffered: the
	// deadline fails no read.
	stall := &stallCount{}
	tk.Start(context.Background(), stall, false)
	f.c.Close()
	require.Eventually(t, func() bool { return stall.n.Load() == 1 }, 5*time.Second, time.Millisecond, "not cut off at shutdown")

	n, err := readAll(tk, bytes.NewReader(make([]byte, 32<<10)))
	tk.Release(false)
	require.ErrorIs(t, err, ErrIdle)
	assert.Zero(t, n)
	assert.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictAdmit))
	assert.Zero(t, f.rec.get(ProtocolHTTP, decision.VerdictDenyBudget))
	assert.Equal(t, 1, f.rec.cut(ProtocolHTTP, CutStopping))
}

// TestObserveOnlyCutsOffAtShutdown: with observe_only the unfinished
// requests are still cut off when the receivers stop, each counted cut off
// once: one let in, one counted would_deny when it arrived and one counted
// would_deny at its first bytes (all three were let in).
func TestObserveOnlyCutsOffAtShutdown(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name  string
		setup func(f *fixture)
		read  bool // reads its first byte before the shutdown
	}{
		{name: "allowed"},
		{name: "would_deny when it arrived", setup: func(f *fixture) { f.dec.setOpen(decision.SignalTraces, true) }},
		{name: "would_deny at its first bytes", read: true, setup: func(f *fixture) {
			other := f.c.keys.key(addr("10.0.0.1"), "")
			f.c.budget.charge(size, other) // the budget is full
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newObserveFixture(t, size)
			f.c.shutdownGrace = 10 * time.Millisecond
			if tc.setup != nil {
				tc.setup(f)
			}
			tk, v := f.http(t, "10.0.0.3", -1)
			require.True(t, v.Admitted(), "observe_only lets it in")
			stall := &stallCount{}
			tk.Start(context.Background(), stall, false)
			if tc.read {
				var one [1]byte
				n, err := tk.Read(bytes.NewReader(make([]byte, 10)), one[:])
				require.NoError(t, err)
				require.Equal(t, 1, n)
				require.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictDenyBudget), "counted would_deny at its first bytes")
			}
			f.c.Close()
			require.Eventually(t, func() bool { return stall.n.Load() == 1 }, 5*time.Second, time.Millisecond, "not cut off")
			tk.Release(false)
			assert.Equal(t, 1, f.rec.cut(ProtocolHTTP, CutStopping))
		})
	}
}

// TestObserveOnlyTrimsNoSilentCall: with observe_only the gRPC calls that
// have not sent their message while their key's undecoded calls hold more
// than its share are not cancelled when a request of that key would be
// refused for the budget.
func TestObserveOnlyTrimsNoSilentCall(t *testing.T) {
	const size = 1 << 20 // a decode reserves 256 KiB; a key's share is 512 KiB
	f := newObserveFixture(t, size)
	f.c.silentGrace = time.Millisecond
	ctx := context.Background()
	var stalls []*stallCount
	for range 3 { // 768 KiB to decode: past the key's share
		tk, v := f.grpc(ctx, "10.0.0.1")
		require.True(t, v.Admitted())
		require.NotNil(t, tk)
		s := &stallCount{}
		stalls = append(stalls, s)
		require.True(t, tk.Start(ctx, s, false).Admitted())
		t.Cleanup(func() { tk.Release(false) })
	}
	time.Sleep(20 * time.Millisecond)    // past the silent grace
	f.c.trimmed.Store(-int64(time.Hour)) // a trim is due
	tk, v := f.http(t, "10.0.0.1", 100)  // its key is past its share: would_deny budget, let in
	require.True(t, v.Admitted())
	if tk != nil {
		tk.Release(false)
	}
	stalled := 0
	for _, s := range stalls {
		stalled += int(s.n.Load())
	}
	assert.Zero(t, stalled, "silent calls cancelled")
	assert.Zero(t, f.rec.cut(ProtocolGRPC, CutSlow), "counted cut off")
}

// TestClientGoneIsNoCutOff: a body waiting for more of the budget whose
// client goes away (its context is cancelled: an HTTP/2 stream reset, a
// client timeout) is not counted cut off: nobody was told to retry.
func TestClientGoneIsNoCutOff(t *testing.T) {
	const size = 1 << 20
	f := newFixture(t, size, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 10 * time.Second })
	other := f.c.keys.key(addr("10.0.0.1"), "")
	f.c.budget.charge(size-32<<10, other) // 32 KiB left: the body's first bytes
	t.Cleanup(func() { f.c.budget.release(size-32<<10, other) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk, v := f.c.Admit(ctx, Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr("10.0.0.3"), Length: -1})
	require.True(t, v.Admitted())
	require.NotNil(t, tk)
	tk.Start(ctx, nil, false)
	done := make(chan error, 1)
	go func() {
		_, err := readAll(tk, bytes.NewReader(make([]byte, 64<<10)))
		done <- err
	}()
	require.Eventually(t, func() bool { return f.c.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
	cancel() // the client goes away
	err := <-done
	tk.Release(false)
	require.Error(t, err)
	assert.Zero(t, f.rec.cut(ProtocolHTTP, CutBudget))
}

// TestGRPCRefusedInStartIsNoCutOff: gRPC calls refused in Start, the one
// let in to wait there and the one the tap admitted, are counted denied
// and not cut off; one admitted in Start and cut off at shutdown is
// counted allowed and cut off once, as stopping.
func TestGRPCRefusedInStartIsNoCutOff(t *testing.T) {
	f := newFixture(t, 1<<20, func(c *Config, h *HoldConfig) {
		*h = HoldConfig{MaxWait: 100 * time.Millisecond, MaxRequests: 8}
		c.WaitTimeout = 100 * time.Millisecond
	})
	f.c.shutdownGrace = 10 * time.Millisecond
	ctx := context.Background()

	// Pending: refused Open at the tap, waits in the hold, still Open.
	f.dec.setOpen(decision.SignalTraces, true)
	tk, v := f.grpc(ctx, "10.0.0.1")
	require.True(t, v.Admitted())
	require.NotNil(t, tk)
	s := &stallCount{}
	assert.Equal(t, decision.VerdictDenyOpen, tk.Start(ctx, s, false))
	tk.Release(false)
	f.dec.setOpen(decision.SignalTraces, false)

	// Admitted at the tap, its decode cannot fit: refused for the budget.
	other := f.c.keys.key(addr("10.0.0.9"), "")
	f.c.budget.charge(1<<20-32<<10, other)
	tk, v = f.grpc(ctx, "10.0.0.2")
	require.True(t, v.Admitted())
	require.NotNil(t, tk)
	assert.Equal(t, decision.VerdictDenyBudget, tk.Start(ctx, s, false))
	tk.Release(false)
	f.c.budget.release(1<<20-32<<10, other)

	assert.Equal(t, 1, f.rec.get(ProtocolGRPC, decision.VerdictDenyOpen))
	assert.Equal(t, 1, f.rec.get(ProtocolGRPC, decision.VerdictDenyBudget))
	assert.Zero(t, f.rec.get(ProtocolGRPC, decision.VerdictAdmit))
	for r := range NumCutReasons {
		assert.Zero(t, f.rec.cut(ProtocolGRPC, r), r.String())
	}

	// Admitted, then cut off at shutdown: allowed and stopping, once.
	tk, v = f.grpc(ctx, "10.0.0.3")
	require.True(t, v.Admitted())
	s = &stallCount{}
	require.True(t, tk.Start(ctx, s, false).Admitted())
	f.c.Close()
	require.Eventually(t, func() bool { return s.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	tk.Release(false)
	assert.Equal(t, 1, f.rec.get(ProtocolGRPC, decision.VerdictAdmit))
	assert.Equal(t, 1, f.rec.cut(ProtocolGRPC, CutStopping))
}

// TestWaitEndedByCloseIsCutOffStopping: a body admitted at its first
// bytes whose wait for more is ended by Close is counted cut off as
// stopping, not budget, once, although the shutdown timer also finds it.
func TestWaitEndedByCloseIsCutOffStopping(t *testing.T) {
	const size = 1 << 20
	f := newFixture(t, size, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 10 * time.Second })
	f.c.shutdownGrace = 10 * time.Millisecond
	other := f.c.keys.key(addr("10.0.0.1"), "")
	f.c.budget.charge(size-32<<10, other)
	t.Cleanup(func() { f.c.budget.release(size-32<<10, other) })
	tk, v := f.http(t, "10.0.0.3", -1)
	require.True(t, v.Admitted())
	stall := &stallCount{}
	tk.Start(context.Background(), stall, false)
	pr, pw := io.Pipe()
	defer pw.Close()
	defer pr.Close()
	go func() { _, _ = pw.Write(make([]byte, 64<<10)) }()
	done := make(chan error, 1)
	go func() {
		_, err := readAll(tk, pr)
		done <- err
	}()
	require.Eventually(t, func() bool { return f.c.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
	f.c.Close()
	require.ErrorIs(t, <-done, ErrBudget)
	time.Sleep(100 * time.Millisecond) // the shutdown timer fires too
	tk.Release(false)
	assert.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictAdmit))
	assert.Equal(t, 1, f.rec.cut(ProtocolHTTP, CutStopping))
	assert.Zero(t, f.rec.cut(ProtocolHTTP, CutBudget))
}
