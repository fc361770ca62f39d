// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/otelthrottle/throttle/internal/decision"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counts is a Recorder counting per (protocol, signal, verdict), and the
// cut-offs per (protocol, signal, reason).
type counts struct {
	mu   sync.Mutex
	n    map[[3]int]int
	cuts map[[3]int]int
}

func (c *counts) CutOff(p Protocol, s decision.Signal, r CutReason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cuts == nil {
		c.cuts = map[[3]int]int{}
	}
	c.cuts[[3]int{int(p), int(s), int(r)}]++
}

// cut is how many traces requests of p were cut off for r.
func (c *counts) cut(p Protocol, r CutReason) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts[[3]int{int(p), int(decision.SignalTraces), int(r)}]
}

func (c *counts) Record(p Protocol, s decision.Signal, v decision.Verdict) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[[3]int]int{}
	}
	c.n[[3]int{int(p), int(s), int(v)}]++
}

func (c *counts) get(p Protocol, v decision.Verdict) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[[3]int{int(p), int(decision.SignalTraces), int(v)}]
}

type fixture struct {
	c   *Controller
	dec *fakeDecider
	rec *counts
}

// newFixture returns a controller with a budget of size bytes, the hold
// off unless edit turns it on.
func newFixture(t *testing.T, size int64, edit func(*Config, *HoldConfig)) *fixture {
	t.Helper()
	return newFixtureExempt(t, size, nil, edit)
}

// newFixtureExempt is newFixture with the signals exempt exempt.
func newFixtureExempt(t *testing.T, size int64, exempt []decision.Signal, edit func(*Config, *HoldConfig)) *fixture {
	t.Helper()
	cfg := NewDefaultConfig()
	cfg.MaxInflightBytes = FixedInflightBudget(ByteSize(size))
	cfg.UnknownSize = 16 << 10
	hold := HoldConfig{}
	if edit != nil {
		edit(&cfg, &hold)
	}
	f := &fixture{dec: &fakeDecider{}, rec: &counts{}}
	for _, sig := range exempt {
		f.dec.exempt[sig] = true
	}
	c, err := New(cfg, hold, Settings{Decider: f.dec, Recorder: f.rec, Budget: size, HeldPool: size})
	require.NoError(t, err)
	f.c = c
	t.Cleanup(c.Close)
	return f
}

func (f *fixture) http(t *testing.T, remote string, length int64) (*Ticket, decision.Verdict) {
	t.Helper()
	return f.c.Admit(context.Background(), Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr(remote), Length: length})
}

func (f *fixture) grpc(ctx context.Context, remote string) (*Ticket, decision.Verdict) {
	return f.c.Admit(ctx, Request{Protocol: ProtocolGRPC, Signal: decision.SignalTraces, Remote: addr(remote), Length: -1})
}

// stallCount counts Stall calls and fails a pipe's pending read.
type stallCount struct {
	n  atomic.Int32
	pr *io.PipeReader
}

func (s *stallCount) Stall() {
	s.n.Add(1)
	if s.pr != nil {
		_ = s.pr.CloseWithError(errors.New("cut off"))
	}
}

func readAll(t *Ticket, r io.Reader) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		m, err := t.Read(r, buf)
		n += int64(m)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
	}
}

// TestHTTPNothingReservedBeforeFirstByte: an admitted body holds nothing
// until its first byte arrives, then what bodies of its key turn out to
// be (unknown_size before any), or its length if smaller.
func TestHTTPNothingReservedBeforeFirstByte(t *testing.T) {
	f := newFixture(t, 1<<20, nil)
	tk, v := f.http(t, "10.0.0.1", 4000)
	require.True(t, v.Admitted())
	pr, pw := io.Pipe()
	tk.Start(context.Background(), &stallCount{pr: pr}, false)
	done := make(chan error, 1)
	go func() {
		_, err := readAll(tk, pr)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	assert.Zero(t, f.c.Stats().Reserved, "a body that sent nothing holds nothing")
	assert.Zero(t, f.rec.get(ProtocolHTTP, decision.VerdictAdmit), "decided, but recorded at its first reservation")
	_, _ = pw.Write([]byte{1})
	require.Eventually(t, func() bool { return f.c.Stats().Reserved == 4000 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictAdmit))
	_, _ = pw.Write(make([]byte, 3999))
	require.NoError(t, pw.Close())
	require.NoError(t, <-done)
	tk.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
	assert.EqualValues(t, 4000, f.c.Stats().Peak)

	// The size is learnt: the next body of the key reserves it at once.
	tk, _ = f.http(t, "10.0.0.1", -1)
	tk.Start(context.Background(), nil, false)
	var one [1]byte
	_, err := tk.Read(bytes.NewReader(make([]byte, 10)), one[:])
	require.NoError(t, err)
	assert.EqualValues(t, 4000, f.c.Stats().Reserved)
	tk.Release(false)
}

// TestHTTPRefusedAtFirstByteIsRecorded: a body whose first bytes find no
// room fails with ErrBudget and counts as a budget refusal, not as admitted.
func TestHTTPRefusedAtFirstByteIsRecorded(t *testing.T) {
	f := newFixture(t, 64<<10, func(c *Config, _ *HoldConfig) { c.Fairness.Share = 1 })
	big, _ := f.http(t, "10.0.0.1", 64<<10)
	big.Start(context.Background(), nil, false)
	_, err := readAll(big, io.LimitReader(bytes.NewReader(make([]byte, 64<<10)), 60<<10))
	require.NoError(t, err)
	tk, v := f.http(t, "10.0.0.2", 16<<10)
	require.True(t, v.Admitted())
	tk.Start(context.Background(), nil, false)
	_, err = readAll(tk, bytes.NewReader(make([]byte, 16<<10)))
	require.ErrorIs(t, err, ErrBudget)
	tk.Release(false)
	big.Release(true)
	assert.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictDenyBudget))
	assert.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictAdmit))
	assert.Zero(t, f.rec.cut(ProtocolHTTP, CutBudget), "a refusal is no cut-off")
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestLaneSharedBySeveralBodies: bodies larger than their key's share read
// on side by side in the oversize lane; one that trickles does not keep
// the others out, and is cut off after its tenure.
func TestLaneSharedBySeveralBodies(t *testing.T) {
	// A key holds at most a quarter of the budget, what it reads beyond
	// goes to the lane's pool (of the budget's size).
	f := newFixture(t, 1<<20, func(c *Config, _ *HoldConfig) { c.Fairness.Share = 0.25 })
	f.c.laneTenure = 300 * time.Millisecond

	trickle, _ := f.http(t, "10.0.0.9", -1)
	trickle.Start(context.Background(), nil, false)
	pr, pw := io.Pipe()
	trickled := make(chan error, 1)
	go func() {
		_, err := readAll(trickle, pr)
		trickled <- err
	}()
	// Past its share, then nothing.
	_, _ = pw.Write(make([]byte, 300<<10))
	require.Eventually(t, func() bool { return f.c.budget.lane.bodies.Load() == 1 }, 10*time.Second, time.Millisecond)

	var wg sync.WaitGroup
	for _, remote := range []string{"10.0.0.1", "10.0.0.2"} {
		wg.Go(func() {
			tk, v := f.http(t, remote, -1)
			assert.True(t, v.Admitted())
			tk.Start(context.Background(), nil, false)
			n, err := readAll(tk, bytes.NewReader(make([]byte, 700<<10)))
			if err != nil {
				t.Errorf("a body beside another in the lane: %v", err)
			}
			assert.EqualValues(t, 700<<10, n)
			tk.Release(true)
		})
	}
	wg.Wait()
	// Past its tenure: its next reservation fails.
	time.Sleep(f.c.laneTenure)
	go func() { _, _ = pw.Write(make([]byte, 128<<10)) }()
	select {
	case err := <-trickled:
		require.ErrorIs(t, err, ErrBudget)
	case <-time.After(5 * time.Second):
		t.Fatal("the trickling body outlived its tenure in the lane")
	}
	assert.Equal(t, 1, f.rec.cut(ProtocolHTTP, CutBudget), "the trickling body, counted admitted, is counted cut off")
	_ = pr.Close()
	trickle.Release(false)
	assert.Zero(t, f.c.Stats().Reserved)
	assert.Zero(t, f.c.budget.lane.bodies.Load())
}

// TestExemptReserve: with a signal exempt, the others fill at most three
// quarters of the budget; the exempt one has the rest, and nothing is
// ever reserved past the budget.
func TestExemptReserve(t *testing.T) {
	f := &fixture{dec: &fakeDecider{}, rec: &counts{}}
	f.dec.exempt[decision.SignalMetrics] = true
	cfg := NewDefaultConfig()
	cfg.MaxInflightBytes = FixedInflightBudget(1 << 20)
	cfg.Fairness.Share = 1
	c, err := New(cfg, HoldConfig{}, Settings{Decider: f.dec, Recorder: f.rec, Budget: 1 << 20})
	require.NoError(t, err)
	defer c.Close()
	b := c.budget
	k := c.keys.key(addr("10.0.0.1"), "")
	assert.True(t, b.admitNow(768<<10, k, 0, t0))
	assert.False(t, b.admitNow(1, k, 0, t0), "the last quarter is the exempt signals'")
	assert.True(t, b.admitNow(256<<10, k, useExempt, t0))
	assert.False(t, b.admitNow(1, k, useExempt, t0), "never past the budget")
	assert.EqualValues(t, 1<<20, b.reserved.Load())
}

// TestGRPCReservesWhatMayBeDecoded: whatever a key's past messages taught
// its estimate, a call holds what grpc-go may decode for it from before
// its message is read until it has been decoded; then its size.
func TestGRPCReservesWhatMayBeDecoded(t *testing.T) {
	f := newFixture(t, 16<<20, func(c *Config, _ *HoldConfig) { c.GRPCMaxMessageSize = 4 * MiB })
	k := f.c.keys.key(addr("10.0.0.1"), "")
	// An empty accepted export: the estimate falls to its floor.
	f.c.keys.learn(k, decision.SignalTraces, 0, now(), false)
	f.c.keys.learn(k, decision.SignalTraces, 0, now(), true)
	tk, v := f.grpc(context.Background(), "10.0.0.1")
	require.True(t, v.Admitted())
	assert.EqualValues(t, minEstimate, f.c.Stats().Reserved, "the tap reserves the estimate")
	require.True(t, tk.Start(context.Background(), nil, false).Admitted())
	assert.EqualValues(t, 4<<20, f.c.Stats().Reserved, "before the message is read: what it may decode to")
	tk.Decoded(100<<10, 10<<10)
	assert.EqualValues(t, 100<<10, f.c.Stats().Reserved, "then what it decoded to")
	tk.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
	assert.Equal(t, 1, f.rec.get(ProtocolGRPC, decision.VerdictAdmit))

	// A streaming call keeps what a message may decode to.
	tk, _ = f.grpc(context.Background(), "10.0.0.1")
	require.True(t, tk.Start(context.Background(), nil, true).Admitted())
	tk.Decoded(100<<10, 10<<10)
	assert.EqualValues(t, 4<<20, f.c.Stats().Reserved)
	tk.Release(true)
}

// TestGRPCDecodesBounded: however many calls a key sends at once, only as
// many are decoded at once as fit in its share, each holding a quarter of
// the budget; the others wait their turn, and go on as the ones before are
// decoded.
func TestGRPCDecodesBounded(t *testing.T) {
	f := newFixture(t, 8<<20, nil) // share 4 MiB; a decode holds 2 MiB
	const n = 6
	var calls []*Ticket
	for range n {
		tk, v := f.grpc(context.Background(), "10.0.0.1")
		require.True(t, v.Admitted())
		calls = append(calls, tk)
	}
	started := make(chan *Ticket, n)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tk := range calls {
		go func() {
			if tk.Start(ctx, nil, false).Admitted() {
				started <- tk
			}
		}()
	}
	var decoding []*Ticket
	for range 2 {
		decoding = append(decoding, <-started)
	}
	select {
	case <-started:
		t.Fatal("a third call was let decode beside two")
	case <-time.After(50 * time.Millisecond):
	}
	assert.EqualValues(t, 4<<20, f.c.Stats().Reserved, "two decodes; the waiting calls gave their estimates back")
	// Each decode that ends lets one more in.
	for range n - 2 {
		decoding[0].Decoded(1000, 100)
		decoding[0].Release(true)
		decoding = append(decoding[1:], <-started)
	}
	for _, tk := range decoding {
		tk.Release(true)
	}
	assert.Zero(t, f.c.Stats().Reserved)
	assert.LessOrEqual(t, f.c.Stats().Peak, int64(4<<20)+n*(16<<10))
}

// waitBehindTwo starts two decodes of one key and a third call that waits
// for them, all let in by the tap first (a budget of 8 MiB: a share of 4,
// a decode of 2); it returns the two and the third's verdict to come (the
// third releases itself when admitted).
func (f *fixture) waitBehindTwo(ctx context.Context, t *testing.T) ([]*Ticket, chan decision.Verdict) {
	var calls []*Ticket
	for range 3 {
		tk, v := f.grpc(context.Background(), "10.0.0.1")
		require.True(t, v.Admitted())
		calls = append(calls, tk)
	}
	for _, tk := range calls[:2] {
		require.True(t, tk.Start(ctx, nil, false).Admitted())
	}
	got := make(chan decision.Verdict, 1)
	go func() {
		v := calls[2].Start(ctx, nil, false)
		if v.Admitted() {
			calls[2].Release(true)
		}
		got <- v
	}()
	require.Eventually(t, func() bool { return f.c.budget.entering.Load() == 1 }, 10*time.Second, time.Millisecond, "the third call waits")
	return calls[:2], got
}

// TestGRPCWaitAtShareDoesNotContend: a call that waits for its own key's
// decodes, with the budget free, does not make the budget contended: that
// would shrink every key to its fair part, and its next calls' waits would
// renew it for as long as the key sends.
func TestGRPCWaitAtShareDoesNotContend(t *testing.T) {
	f := newFixture(t, 8<<20, nil) // share 4 MiB; a decode holds 2 MiB
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, got := f.waitBehindTwo(ctx, t)
	assert.False(t, f.c.keys.contended(now()), "half the budget is free: the key is at its share, the budget is not short")
	// Two more keys reading: contended, each would be held to a third.
	others := []Key{f.c.keys.key(addr("10.0.0.2"), ""), f.c.keys.key(addr("10.0.0.3"), "")}
	for _, k := range others {
		busyAt(f.c.keys, k, now())
	}
	f.c.keys.recount(now(), nil)
	lim, _ := f.c.budget.limitOf(others[0], now())
	assert.EqualValues(t, 4<<20, lim, "another key keeps the configured share")

	first[0].Decoded(1000, 100)
	require.Equal(t, decision.VerdictAdmit, <-got)
	for _, tk := range first {
		tk.Release(true)
	}
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestGRPCWaitSeesItsShareGrowBack: a call waiting at Start because its
// key's fair part of a contended budget is taken by its key's first decode
// is admitted once the contention passes and the key may hold its
// configured share again, although no request gave anything back then.
func TestGRPCWaitSeesItsShareGrowBack(t *testing.T) {
	// Share 4 MiB; a decode holds 2 MiB. With a hold, a call of a key at its
	// share is let in at the tap to wait in Start.
	f := newFixture(t, 8<<20, func(_ *Config, h *HoldConfig) { *h = HoldConfig{MaxWait: 10 * time.Second, MaxRequests: 10} })
	for i := 2; i <= 4; i++ { // three more keys reading: a fair part of 2 MiB
		busyAt(f.c.keys, f.c.keys.key(addr(fmt.Sprintf("10.0.0.%d", i)), ""), now())
	}
	f.c.keys.recount(now(), nil)
	f.c.keys.noteRefused(0, now()) // contended for the next 2 s
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, v := f.grpc(ctx, "10.0.0.1")
	require.True(t, v.Admitted())
	require.True(t, first.Start(ctx, nil, false).Admitted(), "one decode at a time is always possible")
	k := f.c.keys.key(addr("10.0.0.1"), "")
	lim, _ := f.c.budget.limitOf(k, now())
	require.EqualValues(t, 2<<20, lim, "the key's fair part")

	second, v := f.grpc(ctx, "10.0.0.1")
	require.True(t, v.Admitted())
	start := time.Now()
	got := make(chan decision.Verdict, 1)
	go func() { got <- second.Start(ctx, nil, false) }()
	require.Eventually(t, func() bool { return f.c.budget.entering.Load() == 1 }, 10*time.Second, time.Millisecond, "the second call waits")
	require.Equal(t, decision.VerdictAdmit, <-got, "refused after %v: its key's share grew back while it waited", time.Since(start))
	second.Release(true)
	first.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestGRPCOpenWhileWaitingToDecode: a call that waits at Start for what
// its message may decode to is refused Open if its signal turned Open while
// it waited, not let in to leave its message in the pipeline; another
// signal's Open does not refuse it, and one let in without waiting is not
// decided again.
func TestGRPCOpenWhileWaitingToDecode(t *testing.T) {
	f := newFixture(t, 8<<20, nil) // share 4 MiB; a decode holds 2 MiB
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := func(calls []*Ticket) {
		for _, tk := range calls {
			tk.Release(true)
		}
	}

	first, got := f.waitBehindTwo(ctx, t)
	f.dec.setOpen(decision.SignalTraces, true)
	first[0].Decoded(1000, 100)
	first[0].Release(true)
	assert.Equal(t, decision.VerdictDenyOpen, <-got, "Open while it waited")
	assert.Equal(t, 1, f.rec.get(ProtocolGRPC, decision.VerdictDenyOpen))
	done(first[1:])
	assert.Zero(t, f.c.Stats().Reserved, "the refused call holds nothing")
	f.dec.setOpen(decision.SignalTraces, false)

	first, got = f.waitBehindTwo(ctx, t)
	f.dec.setOpen(decision.SignalMetrics, true)
	done(first[:1])
	assert.Equal(t, decision.VerdictAdmit, <-got, "another signal is Open")
	done(first[1:])
	f.dec.setOpen(decision.SignalMetrics, false)

	// Let in by the tap before Open, a call whose decode fits at once goes
	// on: the tap's decision stands.
	tk, v := f.grpc(context.Background(), "10.0.0.1")
	require.True(t, v.Admitted())
	f.dec.setOpen(decision.SignalTraces, true)
	assert.True(t, tk.Start(context.Background(), nil, false).Admitted())
	tk.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestGRPCDecodeWithTinyShare: a key whose share is smaller than a decode
// still has one at a time.
func TestGRPCDecodeWithTinyShare(t *testing.T) {
	f := newFixture(t, 8<<20, nil)
	for i := range 20 { // twenty busy keys: a twentieth of the budget each
		k := f.c.keys.key(addr(fmt.Sprintf("10.0.1.%d", i)), "")
		busyAt(f.c.keys, k, now())
	}
	f.c.keys.recount(now(), nil)
	f.c.keys.noteRefused(0, now())
	tk, v := f.grpc(context.Background(), "10.0.1.1")
	require.True(t, v.Admitted())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	require.True(t, tk.Start(ctx, nil, false).Admitted())
	assert.GreaterOrEqual(t, f.c.Stats().Reserved, int64(2<<20))
	// Decoded, it is in the pipeline still: the key's next call need not
	// wait for the pipeline to be done with it.
	tk.Decoded(1000, 100)
	next, v := f.grpc(context.Background(), "10.0.1.1")
	require.True(t, v.Admitted())
	require.True(t, next.Start(ctx, nil, false).Admitted())
	next.Release(true)
	tk.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestCloseEndsWaitsAndCutsOff: when the receivers stop, held requests are
// refused at once, waits end, and bodies still being received are cut off
// after the grace.
func TestCloseEndsWaitsAndCutsOff(t *testing.T) {
	f := newFixture(t, 1<<20, func(_ *Config, h *HoldConfig) { *h = HoldConfig{MaxWait: time.Minute, MaxRequests: 10} })
	f.c.shutdownGrace = 50 * time.Millisecond

	reading, _ := f.http(t, "10.0.0.1", -1)
	pr, pw := io.Pipe()
	defer pw.Close()
	stall := &stallCount{pr: pr}
	reading.Start(context.Background(), stall, false)
	readErr := make(chan error, 1)
	go func() {
		_, err := readAll(reading, pr)
		readErr <- err
	}()

	f.dec.setOpen(decision.SignalTraces, true)
	held := make(chan decision.Verdict, 1)
	go func() {
		_, v := f.http(t, "10.0.0.2", 10)
		held <- v
	}()
	require.Eventually(t, func() bool { return f.c.Stats().HeldRequests == 1 }, 10*time.Second, time.Millisecond)

	start := time.Now()
	f.c.Close()
	assert.Equal(t, decision.VerdictDenyOpen, <-held)
	require.Error(t, <-readErr)
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.EqualValues(t, 1, stall.n.Load())
	assert.Equal(t, 1, f.rec.cut(ProtocolHTTP, CutStopping))
	reading.Release(false)
	// After Close, nothing is held any more.
	_, v := f.http(t, "10.0.0.3", 10)
	assert.Equal(t, decision.VerdictDenyOpen, v)
	assert.Zero(t, f.c.Stats().HeldRequests)
}

// TestIdleBodyIsCutOff: a body that stops sending within the idle timeout
// is cut off (Stall) and its read fails with ErrIdle.
func TestIdleBodyIsCutOff(t *testing.T) {
	f := newFixture(t, 1<<20, func(c *Config, _ *HoldConfig) { c.IdleTimeout = 100 * time.Millisecond })
	tk, _ := f.http(t, "10.0.0.1", -1)
	pr, pw := io.Pipe()
	defer pw.Close()
	stall := &stallCount{pr: pr}
	tk.Start(context.Background(), stall, false)
	errc := make(chan error, 1)
	go func() {
		_, err := readAll(tk, pr)
		errc <- err
	}()
	_, _ = pw.Write([]byte{1, 2, 3})
	require.ErrorIs(t, <-errc, ErrIdle)
	assert.EqualValues(t, 1, stall.n.Load())
	tk.Release(false)
	assert.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictAdmit))
	assert.Equal(t, 1, f.rec.cut(ProtocolHTTP, CutSlow))
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestHoldPlacesPerKey: a key holds at most its share of the hold's places;
// a second key still finds its own.
func TestHoldPlacesPerKey(t *testing.T) {
	f := newFixture(t, 1<<20, func(_ *Config, h *HoldConfig) { *h = HoldConfig{MaxWait: time.Minute, MaxRequests: 8} })
	f.dec.setOpen(decision.SignalTraces, true)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	refused := atomic.Int32{}
	for range 8 {
		wg.Go(func() {
			_, v := f.c.Admit(ctx, Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr("10.0.0.1"), Length: 1})
			if v == decision.VerdictDenyOpen && ctx.Err() == nil {
				refused.Add(1)
			}
		})
	}
	// A bound, not a timing: under a loaded make test the eight goroutines
	// may take a while to run.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.EqualValues(c, 4, refused.Load(), "one key: half of the places refused")
		assert.EqualValues(c, 4, f.c.Stats().HeldRequests, "and half held")
	}, 10*time.Second, time.Millisecond)
	assert.Never(t, func() bool { return refused.Load() > 4 }, 50*time.Millisecond, time.Millisecond, "no more refused once four are held")
	wg.Go(func() {
		_, _ = f.c.Admit(ctx, Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr("10.0.0.2"), Length: 1})
	})
	require.Eventually(t, func() bool { return f.c.Stats().HeldRequests == 5 }, 10*time.Second, time.Millisecond, "another key finds a place")
	// Admitted when the decision admits again.
	f.dec.setOpen(decision.SignalTraces, false)
	cancel()
	wg.Wait()
}

// TestStandingPressureIsNotHeld: while the pressure has outlasted what the
// hold can bridge (a slow backend), an HTTP request and a gRPC call it
// refuses are answered at once instead of held; once it is no longer
// standing they are held again.
func TestStandingPressureIsNotHeld(t *testing.T) {
	f := newFixture(t, 1<<20, func(_ *Config, h *HoldConfig) { *h = HoldConfig{MaxWait: time.Minute, MaxRequests: 8} })
	f.dec.setOpen(decision.SignalTraces, true)
	f.dec.standing.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan decision.Verdict, 1)
	go func() {
		_, v := f.http(t, "10.0.0.1", 10)
		done <- v
	}()
	// A bound, not a timing: a held request would wait the minute out.
	select {
	case v := <-done:
		assert.Equal(t, decision.VerdictDenyOpen, v)
	case <-time.After(10 * time.Second):
		t.Fatal("the HTTP request was held")
	}
	tk, v := f.grpc(ctx, "10.0.0.1")
	assert.Nil(t, tk, "the gRPC call is refused at its tap, not let in to wait")
	assert.Equal(t, decision.VerdictDenyOpen, v)
	assert.Zero(t, f.c.Stats().HeldRequests)

	f.dec.standing.Store(false)
	var wg sync.WaitGroup
	wg.Go(func() {
		tk, v := f.c.Admit(ctx, Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr("10.0.0.1"), Length: 10})
		if tk != nil {
			tk.Release(false)
		}
		done <- v
	})
	require.Eventually(t, func() bool { return f.c.Stats().HeldRequests == 1 }, 10*time.Second, time.Millisecond, "held again")
	f.dec.setOpen(decision.SignalTraces, false)
	assert.Equal(t, decision.VerdictAdmit, <-done)
	wg.Wait()
}

// TestStandingPressureStillWaitsForBytes: the bound on holding acts on the
// decision's refusals only: a gRPC call the decision admits that finds the
// budget full still waits for its bytes with a place in the hold.
func TestStandingPressureStillWaitsForBytes(t *testing.T) {
	f := newFixture(t, 1<<20, func(_ *Config, h *HoldConfig) { *h = HoldConfig{MaxWait: 5 * time.Second, MaxRequests: 8} })
	f.dec.standing.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, remote := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"} {
		tk, v := f.grpc(ctx, remote)
		require.True(t, v.Admitted())
		require.True(t, tk.Start(ctx, &stallCount{}, false).Admitted())
		t.Cleanup(func() { tk.Release(false) })
	}
	require.EqualValues(t, 1<<20, f.c.Stats().Reserved, "the budget is full")
	tk, v := f.grpc(ctx, "10.0.0.3")
	require.True(t, v.Admitted(), "let in to wait for its bytes, not refused")
	require.NotNil(t, tk)
	assert.EqualValues(t, 1, f.c.Stats().HeldRequests, "waiting with a place in the hold")
	tk.Release(false)
}

// TestSilentCallsTrimmedUnderContention: two keys' calls that never send
// their message hold the budget; a third key's call waits for its bytes,
// and the silent calls of keys above their fair share are cut off after a
// grace, so that it is admitted long before they would have timed out.
func TestSilentCallsTrimmedUnderContention(t *testing.T) {
	// A decode holds 256 KiB, a key alone half the budget; a call that
	// finds the budget full at the tap waits with a place in the hold.
	f := newFixture(t, 1<<20, func(_ *Config, h *HoldConfig) { *h = HoldConfig{MaxWait: 5 * time.Second, MaxRequests: 8} })
	f.c.silentGrace = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var silent []*stallCount
	for _, remote := range []string{"10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"} {
		tk, v := f.grpc(ctx, remote)
		require.True(t, v.Admitted())
		s := &stallCount{}
		silent = append(silent, s)
		require.True(t, tk.Start(ctx, s, false).Admitted())
		t.Cleanup(func() { tk.Release(false) })
	}
	assert.EqualValues(t, 1<<20, f.c.Stats().Reserved, "the silent calls hold the budget")
	tk, v := f.grpc(ctx, "10.0.0.3")
	require.True(t, v.Admitted())
	done := make(chan decision.Verdict, 1)
	go func() { done <- tk.Start(ctx, nil, false) }()
	// The silent calls are cut off; their clients end them.
	require.Eventually(t, func() bool {
		n := 0
		for _, s := range silent {
			n += int(s.n.Load())
		}
		return n > 0
	}, 3*time.Second, time.Millisecond, "no silent call was cut off")
	f.c.tickets.each(func(other *Ticket) {
		// The cut-off marks a ticket under its lock, and may still be
		// marking another one.
		other.mu.Lock()
		killed := other.killed
		other.mu.Unlock()
		if other != tk && killed {
			other.Release(false)
		}
	})
	select {
	case v := <-done:
		assert.True(t, v.Admitted())
	case <-time.After(3 * time.Second):
		t.Fatal("the waiting call was not admitted")
	}
	tk.Release(true)
	stalled := 0
	for _, s := range silent {
		stalled += int(s.n.Load())
	}
	assert.Equal(t, stalled, f.rec.cut(ProtocolGRPC, CutSlow), "each call cut off is counted once")
}

// TestAdmittedAfterCloseIsCutOff: a request admitted after the receivers
// started to stop (another receiver's server still serves) is cut off
// after the grace as well, or a body trickling in would hold its server's
// shutdown for as long as it likes.
func TestAdmittedAfterCloseIsCutOff(t *testing.T) {
	f := newFixture(t, 1<<20, nil)
	f.c.shutdownGrace = 50 * time.Millisecond
	f.c.Close()
	for _, proto := range []Protocol{ProtocolHTTP, ProtocolGRPC} {
		tk, v := f.c.Admit(context.Background(), Request{Protocol: proto, Signal: decision.SignalTraces, Remote: addr("10.0.0.1"), Length: -1})
		require.True(t, v.Admitted())
		stall := &stallCount{}
		require.True(t, tk.Start(context.Background(), stall, false).Admitted())
		require.Eventually(t, func() bool { return stall.n.Load() == 1 }, 2*time.Second, time.Millisecond, "%v: not cut off", proto)
		tk.Release(false)
		assert.Equal(t, 1, f.rec.cut(proto, CutStopping), proto)
	}
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestFairDropsWeighWhatWasRead: a key that taught its learnt size with
// one tiny accepted body, then sends large chunked bodies (failing to
// decode, so never learnt), is weighed by what it sends, not by that
// size: under pressure it is dropped before a key sending a tenth of it.
func TestFairDropsWeighWhatWasRead(t *testing.T) {
	f := newFixture(t, 1<<30, nil)
	ka := f.c.keys.key(addr("10.0.0.1"), "")
	f.c.keys.learn(ka, decision.SignalTraces, 10, now(), false)
	send := func(remote string, length, n int64) {
		tk, v := f.http(t, remote, length)
		require.True(t, v.Admitted())
		tk.Start(context.Background(), nil, false)
		got, err := readAll(tk, bytes.NewReader(make([]byte, n)))
		require.NoError(t, err)
		require.Equal(t, n, got)
		tk.Release(false)
	}
	for range 10 {
		send("10.0.0.1", -1, 1<<20)
		send("10.0.0.2", 100<<10, 100<<10)
	}
	f.dec.drop[decision.SignalTraces].Store(math.Float64bits(0.5))
	f.c.keys.recount(now(), f.dec)
	d := func(k Key) float64 { return float64(f.c.keys.dropThreshold(k, decision.SignalTraces, 0.5)) / (1 << 53) }
	kb := f.c.keys.key(addr("10.0.0.2"), "")
	assert.Greater(t, d(ka), d(kb), "the key sending ten times the bytes is dropped first")
	assert.InDelta(t, 0, d(kb), 1e-9, "the key within its share is not dropped")
}

// TestGRPCCallsWaitingToStartCounted: a call the tap admits gives its
// estimate back at Start and waits there for what its message may decode
// to, holding nothing of the budget, while grpc-go buffers what its client
// sends meanwhile (its stream's window). One key's calls that find the
// budget short must be counted in the held pool and hold places in the
// hold like the calls waiting for a decision, or a key could keep any
// number of them buffering beside a full budget.
func TestGRPCCallsWaitingToStartCounted(t *testing.T) {
	// A decode holds 256 KiB; two other keys leave 100 KiB free, room for
	// the tap's estimates, not for a decode.
	f := newFixture(t, 1<<20, func(_ *Config, h *HoldConfig) { *h = HoldConfig{MaxWait: 5 * time.Second, MaxRequests: 8} })
	for _, remote := range []string{"10.0.0.2", "10.0.0.3"} {
		k := f.c.keys.key(addr(remote), "")
		require.True(t, f.c.budget.admitNow(462<<10, k, 0, now()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// Its estimate learnt from empty exports: the floor, 4 KiB.
	k := f.c.keys.key(addr("10.0.0.1"), "")
	f.c.keys.learn(k, decision.SignalTraces, 0, now(), false)
	f.c.keys.learn(k, decision.SignalTraces, 0, now(), true)
	const calls = 20
	var tickets []*Ticket
	for range calls {
		tk, v := f.grpc(ctx, "10.0.0.1")
		if !v.Admitted() {
			continue
		}
		tickets = append(tickets, tk)
	}
	// Every tap ran first (the connection's reader goroutine), then the
	// calls start.
	for _, tk := range tickets {
		wg.Go(func() {
			tk.Start(ctx, nil, false)
			tk.Release(false)
		})
	}
	time.Sleep(100 * time.Millisecond)
	s := f.c.Stats()
	assert.LessOrEqual(t, s.Waiting, int64(4), "one key waits in at most its half of the hold's places")
	assert.GreaterOrEqual(t, s.Held, s.Waiting*heldWindow, "each waiting call counted in the held pool")
}

// TestOriginOwnRequestsAreOneTenant: with the key a tenant header, behind
// a proxy (one address, its tenants nested) the proxy's address may hold
// the whole budget while it is contended, for its tenants to share. A
// client of it that sends no tenant header is keyed by the address itself:
// it must hold no more than a tenant, or it fills what the address may
// hold and every tenant is refused.
func TestOriginOwnRequestsAreOneTenant(t *testing.T) {
	const budget = 1 << 20
	f := newFixture(t, budget, func(c *Config, _ *HoldConfig) { c.Fairness.Key, c.Fairness.Header = KeyHeader, "X-Tenant" })
	const proxy = "10.0.0.1"
	send := func(tenant string, n int64) (*Ticket, error) {
		req := Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr(proxy), Length: n, Header: http.Header{}}
		if tenant != "" {
			req.Header.(http.Header).Set("X-Tenant", tenant)
		}
		tk, v := f.c.Admit(context.Background(), req)
		if !v.Admitted() {
			return nil, ErrBudget
		}
		tk.Start(context.Background(), nil, false)
		_, err := readAll(tk, io.LimitReader(bytes.NewReader(make([]byte, n)), n-1)) // held: its last byte still to come
		return tk, err
	}
	// A tenant has sent: the proxy's address nests tenants. The budget is
	// contended, the proxy the only client reading.
	tk, err := send("t1", 1<<10)
	require.NoError(t, err)
	tk.Release(true)
	origin := f.c.keys.key(addr(proxy), "")
	f.c.keys.noteRefused(origin, now())
	f.c.keys.recount(now(), nil)
	// The client without a tenant header takes all it can.
	for range 8 {
		if tk, err := send("", 128<<10); err == nil {
			t.Cleanup(func() { tk.Release(false) })
		} else if tk != nil {
			tk.Release(false)
		}
	}
	tk, err = send("t2", 64<<10)
	require.NoError(t, err, "another tenant is starved")
	tk.Release(false)
}

// TestOriginOwnRequestsHoldOneTenantsPlaces: behind a proxy, with the key
// a tenant header, a client sending no tenant header holds no more of the
// hold's places than a tenant: the others are still held, not refused.
func TestOriginOwnRequestsHoldOneTenantsPlaces(t *testing.T) {
	f := newFixture(t, 1<<20, func(c *Config, h *HoldConfig) {
		c.Fairness.Key, c.Fairness.Header = KeyHeader, "X-Tenant"
		*h = HoldConfig{MaxWait: time.Minute, MaxRequests: 8}
	})
	const proxy = "10.0.0.1"
	req := func(tenant string) Request {
		r := Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr(proxy), Length: 1, Header: http.Header{}}
		if tenant != "" {
			r.Header.(http.Header).Set("X-Tenant", tenant)
		}
		return r
	}
	tk, v := f.c.Admit(context.Background(), req("t1")) // the proxy's address nests tenants
	require.True(t, v.Admitted())
	tk.Release(true)
	f.c.keys.recount(now(), nil)

	f.dec.open[decision.SignalTraces].Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 8 {
		wg.Go(func() { _, _ = f.c.Admit(ctx, req("")) })
	}
	time.Sleep(50 * time.Millisecond)
	wg.Go(func() { _, _ = f.c.Admit(ctx, req("t2")) })
	require.Eventually(t, func() bool { return f.c.keys.slot(f.c.keys.key(addr(proxy), "t2")).held.Load() == 1 }, 10*time.Second, time.Millisecond,
		"another tenant finds no place in the hold")
}

// TestSlotsNotReusedUnderUnfinishedRequests: a request admitted but not
// yet reading (its head start is longer than a key's idleness) keeps its
// key's slot and its origin's: were they given to other keys meanwhile,
// its bytes would be counted to them and given back by others, and the
// counts would drift (a key holding for ever what it never had, another
// room it never gave back).
func TestSlotsNotReusedUnderUnfinishedRequests(t *testing.T) {
	f := newFixture(t, 1<<20, func(c *Config, _ *HoldConfig) { c.Fairness.Key, c.Fairness.Header = KeyHeader, "X-Tenant" })
	kt := f.c.keys
	req := func(remote, tenant string) Request {
		r := Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr(remote), Length: 1 << 10, Header: http.Header{}}
		r.Header.(http.Header).Set("X-Tenant", tenant)
		return r
	}
	r1, v := f.c.Admit(context.Background(), req("10.0.0.1", "t"))
	require.True(t, v.Admitted())
	r1.Start(context.Background(), nil, false)
	origin := kt.parentOf(r1.key)
	originID := kt.slot(origin).id.Load()

	// Later than activeFor, other clients arrive (their first requests).
	kt.clock = func() time.Duration { return now() + 2*activeFor }
	for i := 0; i < 20000 && kt.slot(origin).id.Load() == originID; i++ {
		kt.key(addr(fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256)), "")
	}
	// r1 reads; the same client sends again; both end.
	_, err := readAll(r1, bytes.NewReader(make([]byte, 1<<10)))
	require.NoError(t, err)
	r2, v := f.c.Admit(context.Background(), req("10.0.0.1", "t"))
	require.True(t, v.Admitted())
	r2.Start(context.Background(), nil, false)
	_, err = readAll(r2, bytes.NewReader(make([]byte, 1<<10)))
	require.NoError(t, err)
	r1.Release(true)
	r2.Release(true)
	for i := range kt.slots {
		require.Zero(t, kt.slots[i].reserved.Load(), "slot %d", i)
	}
}

// TestTicketMisuse: a ticket released twice, or read, decoded or started
// after its release, gives back nothing twice and takes nothing more: no
// count goes negative or keeps bytes.
func TestTicketMisuse(t *testing.T) {
	f := newFixture(t, 1<<20, nil)
	h, _ := f.http(t, "10.0.0.1", -1)
	h.Start(context.Background(), nil, false)
	_, err := h.Read(bytes.NewReader(make([]byte, 100)), make([]byte, 64))
	require.NoError(t, err)
	h.Release(false)
	h.Release(true)
	_, err = h.Read(bytes.NewReader(make([]byte, 100)), make([]byte, 64))
	require.Error(t, err)

	g, _ := f.grpc(context.Background(), "10.0.0.1")
	require.True(t, g.Start(context.Background(), nil, false).Admitted())
	g.Release(false)
	g.Decoded(1<<20, 1<<10)
	g.Release(true)
	assert.False(t, g.Start(context.Background(), nil, false).Admitted(), "started after its release")

	s := f.c.Stats()
	assert.Zero(t, s.Reserved)
	assert.Zero(t, s.Inflight)
	assert.Zero(t, s.Held)
	k := f.c.keys.key(addr("10.0.0.1"), "")
	assert.Zero(t, f.c.keys.slot(k).reserved.Load())
	assert.Zero(t, f.c.keys.slot(k).decoding.Load())
	assert.Zero(t, f.c.keys.slot(k).live.Load())
}

// TestProxiedTenantsShareTheWholeBudget: behind a proxy, with the key a
// tenant header, nine tenants with two exports each in flight hold all but
// a sliver of the budget, none refused: the proxy, the only client, is
// every client. A tenant refused at its share, with the budget free, does
// not make it contended (which would shrink every tenant to its fair part).
func TestProxiedTenantsShareTheWholeBudget(t *testing.T) {
	const budget = 1 << 20
	const export = 56 << 10
	const proxy = "10.0.0.1"
	newProxied := func() (*fixture, func(tenant string, n int64) decision.Verdict) {
		f := newFixture(t, budget, func(c *Config, _ *HoldConfig) { c.Fairness.Key, c.Fairness.Header = KeyHeader, "X-Tenant" })
		return f, func(tenant string, n int64) decision.Verdict {
			req := Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: addr(proxy), Length: n, Header: http.Header{"X-Tenant": {tenant}}}
			tk, v := f.c.Admit(context.Background(), req)
			if !v.Admitted() {
				return v
			}
			tk.Start(context.Background(), nil, false)
			t.Cleanup(func() { tk.Release(false) })
			if _, err := readAll(tk, io.LimitReader(bytes.NewReader(make([]byte, n)), n-1)); err != nil { // its last byte still to come
				return decision.VerdictDenyBudget
			}
			return v
		}
	}
	f, send := newProxied()
	require.Equal(t, decision.VerdictAdmit, send("tenant-1", 1<<10))
	f.c.keys.recount(now(), nil) // the proxy reads, alone
	for i := range 9 {
		for j := range 2 {
			require.Equal(t, decision.VerdictAdmit, send(fmt.Sprint("tenant-", i+1), export), "tenant-%d's export %d", i+1, j+1)
		}
	}
	assert.Zero(t, f.rec.get(ProtocolHTTP, decision.VerdictDenyBudget))
	assert.False(t, f.c.keys.contended(now()))

	f, send = newProxied()
	require.Equal(t, decision.VerdictAdmit, send("tenant-1", 1<<10))
	f.c.keys.recount(now(), nil)
	require.Equal(t, decision.VerdictAdmit, send("tenant-1", budget/2-1<<10), "a tenant may hold the share of the budget")
	require.Equal(t, decision.VerdictDenyBudget, send("tenant-1", 1), "and no more")
	assert.False(t, f.c.keys.contended(now()), "a tenant at its share does not contend the budget")
}

// A gRPC call waits for most of the time its client gave it: four fifths,
// leaving a second to be handled, at most two minutes; without a
// deadline, the hold's max_wait.
func TestCallWaitLeft(t *testing.T) {
	f := newFixture(t, 1<<20, func(_ *Config, h *HoldConfig) { h.MaxWait, h.MaxRequests = 8*time.Second, 8 })
	tk := &Ticket{c: f.c, age: now()}
	check := func(deadline, want time.Duration) {
		t.Helper()
		ctx := context.Background()
		if deadline > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, deadline)
			defer cancel()
		}
		assert.InDelta(t, want.Seconds(), tk.callWaitLeft(ctx).Seconds(), 0.5, "deadline %v", deadline)
	}
	check(0, 8*time.Second)
	check(2*time.Second, time.Second)
	check(10*time.Second, 8*time.Second)
	check(2*time.Minute, 96*time.Second)
	check(10*time.Minute, 2*time.Minute)
}

// TestLaneAllowanceCountsDecodedCalls: under pressure a key may read in the
// oversize lane its share of what the other keys read, gRPC calls' decoded
// messages included: large gzip'd HTTP batches beside large gRPC ones were
// refused as owing the lane, and their clients lost them after retrying.
func TestLaneAllowanceCountsDecodedCalls(t *testing.T) {
	const size = 64 << 10
	f := newFixture(t, size, nil)
	f.dec.pressed.Store(true)
	body := func() error {
		tk, v := f.http(t, "10.0.0.1", -1)
		if !v.Admitted() {
			return fmt.Errorf("refused unread: %v", v)
		}
		tk.Start(context.Background(), nil, false)
		_, err := readAll(tk, bytes.NewReader(make([]byte, 4*size)))
		tk.Release(err == nil)
		return err
	}
	require.NoError(t, body(), "the lane is free: the first large body reads in it")
	// Another key's gRPC calls decode eight times what the first read.
	for range 8 {
		tk, v := f.grpc(context.Background(), "10.0.0.2")
		require.True(t, v.Admitted())
		require.True(t, tk.Start(context.Background(), nil, false).Admitted())
		tk.Decoded(4*size, size/8)
		tk.Release(true)
	}
	require.NoError(t, body(), "it read less in the lane than its share of what the other key decoded")
	assert.Zero(t, f.c.Stats().Reserved)
}

// pipedBody is an admitted body of unknown length fed through a pipe and
// read on its own goroutine until it ends (done).
type pipedBody struct {
	tk   *Ticket
	pr   *io.PipeReader
	pw   *io.PipeWriter
	done chan error
}

func (f *fixture) pipedBody(t *testing.T, remote string) *pipedBody {
	t.Helper()
	tk, v := f.http(t, remote, -1)
	require.True(t, v.Admitted())
	tk.Start(context.Background(), nil, false)
	pr, pw := io.Pipe()
	b := &pipedBody{tk: tk, pr: pr, pw: pw, done: make(chan error, 1)}
	go func() {
		_, err := readAll(tk, pr)
		b.done <- err
	}()
	return b
}

// fillLane starts two bodies that, each past its share of a budget of
// size with a quarter share per key, fill the oversize lane's pool; then
// the younger wants more and waits for the pool.
func (f *fixture) fillLane(t *testing.T, size int) (older, younger *pipedBody) {
	t.Helper()
	older, younger = f.pipedBody(t, "10.0.0.1"), f.pipedBody(t, "10.0.0.2")
	_, _ = older.pw.Write(make([]byte, size/4+size/2))
	_, _ = younger.pw.Write(make([]byte, size/4+size/2-1<<10))
	require.Eventually(t, func() bool { return f.c.budget.lane.bodies.Load() == 2 }, 10*time.Second, time.Millisecond)
	go func() { _, _ = younger.pw.Write(make([]byte, size)); _ = younger.pw.Close() }()
	require.Eventually(t, func() bool { return f.c.budget.lane.waiting.Load() == 1 }, 10*time.Second, time.Millisecond)
	return older, younger
}

// TestLaneBodiesDoNotWaitForEachOther: when every body in the oversize lane
// waits for its pool, the oldest reads on past it: they waited for one
// another until their waits ran out, and were refused half read.
func TestLaneBodiesDoNotWaitForEachOther(t *testing.T) {
	const size = 64 << 10
	f := newFixture(t, size, func(c *Config, _ *HoldConfig) {
		c.Fairness.Share = 0.25
		c.WaitTimeout = 2 * time.Second
	})
	older, younger := f.fillLane(t, size)
	// Both want more: the younger waits for the older, which reads on.
	go func() { _, _ = older.pw.Write(make([]byte, size)); _ = older.pw.Close() }()
	require.NoError(t, <-older.done, "the oldest body in the lane")
	older.tk.Release(true)
	require.NoError(t, <-younger.done, "the younger, once the older let go")
	younger.tk.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
	assert.Zero(t, f.c.budget.lane.used.Load())
}

// TestHTTPOpenWhileWaitingForBudget: a body that waited for budget bytes
// while its signal turned Open is refused Open and gives them back, as a
// gRPC call waiting to decode is; without Open it reads on. Both waits:
// for its first bytes, and for more once its first bytes were read.
func TestHTTPOpenWhileWaitingForBudget(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name   string
		filled int64 // what another key holds
		kept   int64 // what the body holds once refused: its first bytes
	}{
		{"first bytes", size, 0},
		{"more bytes", size - 32<<10, 32 << 10},
	} {
		for _, open := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/open=%v", tc.name, open), func(t *testing.T) {
				f := newFixture(t, size, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 10 * time.Second })
				other := f.c.keys.key(addr("10.0.0.1"), "")
				f.c.budget.charge(tc.filled, other)
				tk, v := f.http(t, "10.0.0.3", -1)
				require.True(t, v.Admitted())
				tk.Start(context.Background(), nil, false)
				done := make(chan error, 1)
				go func() {
					_, err := readAll(tk, bytes.NewReader(make([]byte, 64<<10)))
					done <- err
				}()
				require.Eventually(t, func() bool { return f.c.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)
				f.dec.setOpen(decision.SignalTraces, open)
				f.c.budget.release(tc.filled, other)
				err := <-done
				held := f.c.Stats().Reserved
				tk.Release(err == nil)
				if open {
					require.ErrorIs(t, err, ErrOpen)
					assert.Equal(t, tc.kept, held, "what the wait got is given back")
				} else {
					require.NoError(t, err)
				}
				recorded, cut := decision.VerdictAdmit, 0 // at its first bytes
				switch {
				case open && tc.kept == 0:
					recorded = decision.VerdictDenyOpen
				case open:
					cut = 1 // admitted at its first bytes, then cut off
				}
				assert.Equal(t, 1, f.rec.get(ProtocolHTTP, recorded))
				assert.Equal(t, cut, f.rec.cut(ProtocolHTTP, CutOpen))
				assert.Zero(t, f.c.Stats().Reserved)
			})
		}
	}
}

// startedCalls admits and starts n gRPC calls of remote, none decoded yet.
func (f *fixture) startedCalls(ctx context.Context, t *testing.T, remote string, n int, streaming bool) []*Ticket {
	t.Helper()
	var calls []*Ticket
	for range n {
		tk, v := f.grpc(ctx, remote)
		require.True(t, v.Admitted())
		require.True(t, tk.Start(ctx, nil, streaming).Admitted())
		calls = append(calls, tk)
	}
	return calls
}

// TestHTTPBodyWaitsForItsKeysDecodes: a body whose key's share is held by
// its own gRPC calls' messages still to be decoded is admitted and waits
// for a decode to give back, instead of being refused, and another key's
// call passes it without contending the budget; a key at its share by what
// it holds otherwise is still refused at once.
func TestHTTPBodyWaitsForItsKeysDecodes(t *testing.T) {
	f := newFixture(t, 8<<20, func(c *Config, h *HoldConfig) { // share 4 MiB; a decode holds 2 MiB
		c.WaitTimeout = 10 * time.Second
		*h = HoldConfig{MaxWait: time.Second, MaxRequests: 8}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := f.startedCalls(ctx, t, "10.0.0.1", 2, false)
	require.EqualValues(t, 4<<20, f.c.Stats().Reserved, "the key's share is its two decodes")

	tk, v := f.http(t, "10.0.0.1", -1)
	require.True(t, v.Admitted(), "what its decodes hold comes back")
	tk.Start(ctx, nil, false)
	done := make(chan error, 1)
	go func() {
		_, err := readAll(tk, bytes.NewReader(make([]byte, 40<<10)))
		done <- err
	}()
	require.Eventually(t, func() bool { return f.c.budget.entering.Load() == 1 }, 10*time.Second, time.Millisecond, "the body waits")
	assert.False(t, f.c.keys.contended(now()), "half the budget is free: the budget is not short")
	// Another key's call passes it: its key's share, not the budget, is
	// short.
	passing, v := f.grpc(ctx, "10.0.0.2")
	require.True(t, v.Admitted())
	require.True(t, passing.Start(ctx, nil, false).Admitted())
	assert.False(t, f.c.keys.contended(now()), "the call did not wait")
	passing.Release(true)
	calls[0].Decoded(40<<10, 20<<10)
	require.NoError(t, <-done)
	tk.Release(true)
	for _, c := range calls {
		c.Release(true)
	}
	assert.Equal(t, 1, f.rec.get(ProtocolHTTP, decision.VerdictAdmit))
	assert.Zero(t, f.rec.get(ProtocolHTTP, decision.VerdictDenyBudget))
	assert.Zero(t, f.c.Stats().Reserved)

	other := f.c.keys.key(addr("10.0.0.2"), "")
	f.c.budget.charge(4<<20, other)
	_, v = f.http(t, "10.0.0.2", -1)
	assert.Equal(t, decision.VerdictDenyBudget, v, "a key at its share by what it read")
	f.c.budget.release(4<<20, other)
}

// TestBodiesWaitingForTheirKeysDecodesBounded: the bodies that wait for
// their key's decodes each hold a place in the hold, so a key with silent
// calls cannot park any number of them; beyond its places they are refused
// at once, as before they could wait at all.
func TestBodiesWaitingForTheirKeysDecodesBounded(t *testing.T) {
	f := newFixture(t, 8<<20, func(c *Config, h *HoldConfig) {
		c.WaitTimeout = 10 * time.Second
		*h = HoldConfig{MaxWait: time.Second, MaxRequests: 8}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := f.startedCalls(ctx, t, "10.0.0.1", 2, false) // silent: their messages never come
	const n = 40
	var bodies []*pipedBody
	for range n {
		b := f.pipedBody(t, "10.0.0.1")
		go func() { _, _ = b.pw.Write([]byte{1}) }()
		bodies = append(bodies, b)
	}
	refused := 0
	require.Eventually(t, func() bool {
		refused = 0
		for _, b := range bodies {
			refused += len(b.done)
		}
		return refused >= n-4
	}, 5*time.Second, 5*time.Millisecond, "beyond its places (half the hold's), refused at once")
	assert.LessOrEqual(t, f.c.budget.entering.Load(), int32(4), "at most its places wait")
	for _, b := range bodies {
		_ = b.pw.Close()
	}
	calls[0].Decoded(1000, 100)
	calls[1].Decoded(1000, 100)
	errs := make([]error, n)
	for i, b := range bodies {
		errs[i] = <-b.done // refused, or read to EOF once a decode gave back
	}
	assert.Zero(t, f.c.hold.count(), "every place given back once its wait is over")
	assert.Zero(t, f.c.budget.held.Load())
	for i, b := range bodies {
		b.tk.Release(errs[i] == nil)
	}
	for _, c := range calls {
		c.Release(true)
	}
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestHTTPBodyTakesWhatFitsBesideItsKeysDecode: a body that fits in what
// its key's share leaves free is read at once, not made to wait for its
// key's decodes.
func TestHTTPBodyTakesWhatFitsBesideItsKeysDecode(t *testing.T) {
	f := newFixture(t, 8<<20, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 10 * time.Second; c.UnknownSize = MiB })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call, v := f.grpc(ctx, "10.0.0.1")
	require.True(t, v.Admitted())
	require.True(t, call.Start(ctx, nil, false).Admitted()) // its message is slow to come
	k := f.c.keys.key(addr("10.0.0.1"), "")
	f.c.budget.charge(1536<<10, k) // decoded messages still in the pipeline
	tk, v := f.http(t, "10.0.0.1", -1)
	require.True(t, v.Admitted())
	tk.Start(ctx, nil, false)
	done := make(chan error, 1)
	go func() { _, err := readAll(tk, bytes.NewReader(make([]byte, 100<<10))); done <- err }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("waits for its key's decode though 512 KiB of its share are free")
	}
	tk.Release(true)
	f.c.budget.release(1536<<10, k)
	call.Release(true)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestHTTPBodyRefusedWhenItsKeysStreamsHoldItsShare: a streaming call holds
// what a message may decode to for its whole life; a body does not wait
// for that.
func TestHTTPBodyRefusedWhenItsKeysStreamsHoldItsShare(t *testing.T) {
	f := newFixture(t, 8<<20, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 10 * time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	streams := f.startedCalls(ctx, t, "10.0.0.1", 2, true)
	for _, tk := range streams {
		tk.Decoded(1000, 100)
	}
	_, v := f.http(t, "10.0.0.1", -1)
	assert.Equal(t, decision.VerdictDenyBudget, v, "a stream's decode comes back only when it ends")
	for _, s := range streams {
		s.Release(true)
	}
	k := f.c.keys.key(addr("10.0.0.1"), "")
	assert.Zero(t, f.c.keys.slot(k).streaming.Load())
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestGrowAtItsKeysShareDoesNotContend: a body that needs more while its
// key's other requests hold the rest of its share, with the budget free,
// waits without making the budget contended: that would hold every key,
// the tenants behind a proxy each, to its fair part of the budget.
func TestGrowAtItsKeysShareDoesNotContend(t *testing.T) {
	f := newFixture(t, 1<<20, func(c *Config, _ *HoldConfig) { c.WaitTimeout = 100 * time.Millisecond }) // share 512 KiB
	k := f.c.keys.key(addr("10.0.0.1"), "")
	f.c.budget.charge(448<<10, k) // the key's other requests
	tk, v := f.http(t, "10.0.0.1", -1)
	require.True(t, v.Admitted())
	tk.Start(context.Background(), nil, false)
	n, err := readAll(tk, bytes.NewReader(make([]byte, 200<<10)))
	require.ErrorIs(t, err, ErrBudget, "its share is full")
	assert.EqualValues(t, 64<<10, n, "what its share had room for")
	assert.False(t, f.c.keys.contended(now()), "its share, not the budget, was short")
	tk.Release(false)
	f.c.budget.release(448<<10, k)
	assert.Zero(t, f.c.Stats().Reserved)
}

// TestLaneOpenWhileWaiting: a body in the oversize lane that waited for the
// lane's pool while its signal turned Open is refused Open, as a body
// waiting for the budget is, and the lane's bytes all come back; without
// Open it reads on.
func TestLaneOpenWhileWaiting(t *testing.T) {
	const size = 64 << 10
	for _, open := range []bool{true, false} {
		t.Run(fmt.Sprintf("open=%v", open), func(t *testing.T) {
			f := newFixture(t, size, func(c *Config, _ *HoldConfig) {
				c.Fairness.Share = 0.25
				c.WaitTimeout = 10 * time.Second
			})
			older, younger := f.fillLane(t, size)
			f.dec.setOpen(decision.SignalTraces, open)
			// The older ends and gives its lane bytes back.
			_ = older.pw.Close()
			require.NoError(t, <-older.done)
			older.tk.Release(true)
			err := <-younger.done
			_ = younger.pr.Close() // a refused body's writer stops
			younger.tk.Release(err == nil)
			if open {
				require.ErrorIs(t, err, ErrOpen)
			} else {
				require.NoError(t, err)
			}
			assert.Zero(t, f.c.Stats().Reserved)
			assert.Zero(t, f.c.budget.lane.used.Load())
			assert.Zero(t, f.c.budget.lane.bodies.Load())
		})
	}
}
