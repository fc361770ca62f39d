// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"bytes"
	"context"
	"math"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeDecider is the state machines' seam: a settable verdict per signal
// (Open refuses everything, Shedding drops with probability 1 unless a
// drop is set), exempt signals and pressure; it counts the decisions
// asked of it.
type fakeDecider struct {
	verdict [decision.NumSignals]atomic.Uint32
	drop    [decision.NumSignals]atomic.Uint64 // float64 bits; 0: 1
	exempt  [decision.NumSignals]atomic.Bool
	pressed atomic.Bool
	decides atomic.Int64
}

func (f *fakeDecider) set(s decision.Signal, v decision.Verdict) { f.verdict[s].Store(uint32(v)) }

func (f *fakeDecider) setAll(v decision.Verdict) {
	for s := range decision.NumSignals {
		f.set(s, v)
	}
}

// setDrop makes s shed with probability p.
func (f *fakeDecider) setDrop(s decision.Signal, p float64) {
	f.drop[s].Store(math.Float64bits(p))
	f.set(s, decision.VerdictDenyShed)
}

func (f *fakeDecider) Pressure(s decision.Signal) (bool, float64) {
	f.decides.Add(1)
	switch decision.Verdict(f.verdict[s].Load()) {
	case decision.VerdictDenyOpen:
		return true, 0
	case decision.VerdictDenyShed:
		if p := math.Float64frombits(f.drop[s].Load()); p > 0 {
			return false, p
		}
		return false, 1
	}
	return false, 0
}

func (f *fakeDecider) Exempt(s decision.Signal) bool { return f.exempt[s].Load() }

// Pressed is true while pressed is set or the verdict set for s is a
// denial.
func (f *fakeDecider) Pressed(s decision.Signal) bool {
	return f.pressed.Load() || decision.Verdict(f.verdict[s].Load()) != decision.VerdictAdmit
}

// Holdable is always true: the middleware's tests hold whenever the hold
// is on (the admission's own tests cover a pressure the hold cannot bridge).
func (f *fakeDecider) Holdable(decision.Signal) bool { return true }

// countingRecorder counts Record calls per (protocol, signal, verdict) and
// CutOff calls per (protocol, signal, reason).
type countingRecorder struct {
	n    [admission.NumProtocols][decision.NumSignals][decision.NumVerdicts]atomic.Int64
	cuts [admission.NumProtocols][decision.NumSignals][admission.NumCutReasons]atomic.Int64
}

func (c *countingRecorder) CutOff(p admission.Protocol, s decision.Signal, r admission.CutReason) {
	c.cuts[p][s][r].Add(1)
}

func (c *countingRecorder) Record(p admission.Protocol, s decision.Signal, v decision.Verdict) {
	c.n[p][s][v].Add(1)
}

func (c *countingRecorder) get(p admission.Protocol, s decision.Signal, v decision.Verdict) int64 {
	return c.n[p][s][v].Load()
}

func (c *countingRecorder) total() int64 {
	var t int64
	for p := range c.n {
		for s := range c.n[p] {
			for v := range c.n[p][s] {
				t += c.n[p][s][v].Load()
			}
		}
	}
	return t
}

func mustClassifier(tb testing.TB, user Routes) *Classifier {
	tb.Helper()
	c, err := NewClassifier(user)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Short names of the protocols.
const (
	protoHTTP = admission.ProtocolHTTP
	protoGRPC = admission.ProtocolGRPC
)

// admSetup is what a test's admission is built from.
type admSetup struct {
	cfg  admission.Config
	hold admission.HoldConfig
	set  admission.Settings
	dec  *fakeDecider
	mw   []func(*Config)
}

// admOption changes an admSetup.
type admOption func(*admSetup)

// withDefaultShare lets one key hold alone the default share of the
// budget, a half (the tests' default is 1: no per-key limit).
func withDefaultShare() admOption {
	return func(s *admSetup) { s.cfg.Fairness.Share = admission.DefaultShare }
}

// withUnknownSize sets what a body reserves first while nothing is learnt.
func withUnknownSize(n int64) admOption {
	return func(s *admSetup) { s.cfg.UnknownSize = admission.ByteSize(n) }
}

// withIdle sets the idle timeout (the tests' default is off); admission.New
// takes shorter ones than the configuration allows, to keep tests short.
func withIdle(d time.Duration) admOption { return func(s *admSetup) { s.cfg.IdleTimeout = d } }

// withWait sets how long a body or call waits for bytes.
func withWait(d time.Duration) admOption { return func(s *admSetup) { s.cfg.WaitTimeout = d } }

// withMaxMessage sets the largest message the gRPC servers decode.
func withMaxMessage(n int64) admOption {
	return func(s *admSetup) { s.cfg.GRPCMaxMessageSize = admission.ByteSize(n) }
}

// withHold turns the hold on.
func withHold(maxWait time.Duration, maxRequests int) admOption {
	return func(s *admSetup) {
		s.hold = admission.HoldConfig{MaxWait: maxWait, MaxRequests: maxRequests}
	}
}

// withHeldPool sets the pool of what waiting gRPC streams may buffer (the
// tests' default is 1 MiB).
func withHeldPool(n int64) admOption { return func(s *admSetup) { s.set.HeldPool = n } }

// withObserveOnly makes the admission count its decisions only.
func withObserveOnly() admOption { return func(s *admSetup) { s.set.ObserveOnly = true } }

// withExempt makes sig exempt from the start (the controller learns which
// signals are exempt when it is built).
func withExempt(sig decision.Signal) admOption {
	return func(s *admSetup) { s.dec.exempt[sig].Store(true) }
}

// withFairness edits the fairness section.
func withFairness(edit func(*admission.FairnessConfig)) admOption {
	return func(s *admSetup) { edit(&s.cfg.Fairness) }
}

// withMiddleware edits the middleware's Config.
func withMiddleware(edit func(*Config)) admOption {
	return func(s *admSetup) { s.mw = append(s.mw, edit) }
}

// admFixture is a real admission controller with a fake decider and a
// counting recorder.
type admFixture struct {
	dec   *fakeDecider
	rec   *countingRecorder
	adm   *admission.Controller
	setup admSetup
}

// newAdm builds the admission of the tests: a fixed budget of budget bytes
// (0: off), unknown_size 1 MiB, no idle timeout, a wait of 1 s, one key
// may hold the whole budget, no hold, unless opts say otherwise.
func newAdm(tb testing.TB, budget int64, opts ...admOption) *admFixture {
	tb.Helper()
	s := admSetup{
		cfg: admission.Config{
			MaxInflightBytes:   admission.FixedInflightBudget(admission.ByteSize(budget)),
			UnknownSize:        admission.DefaultUnknownSize,
			WaitTimeout:        admission.DefaultWaitTimeout,
			GRPCMaxMessageSize: admission.DefaultGRPCMaxMessageSize,
			Fairness:           admission.FairnessConfig{Key: admission.KeyAddress, Share: 1},
		},
		dec: &fakeDecider{},
		set: admission.Settings{Budget: budget, HeldPool: 1 << 20},
	}
	for _, o := range opts {
		o(&s)
	}
	rec := &countingRecorder{}
	s.set.Decider, s.set.Recorder = s.dec, rec
	adm, err := admission.New(s.cfg, s.hold, s.set)
	require.NoError(tb, err)
	tb.Cleanup(adm.Close)
	return &admFixture{dec: s.dec, rec: rec, adm: adm, setup: s}
}

func (a *admFixture) stats() admission.Stats { return a.adm.Stats() }

// keyReserved is what the key named name (an address) holds of the budget.
func (a *admFixture) keyReserved(name string) int64 {
	top, _ := a.adm.TopKeys(1 << 12)
	for _, k := range top {
		if k.Name == name {
			return k.Reserved
		}
	}
	return 0
}

// reserve makes a request of sig from remote hold n bytes of the budget,
// as an HTTP body of n bytes that has been read but not ended (its
// decision is recorded as an admission); release gives them back. n must
// fit in the budget and in what remote's key may hold.
func (a *admFixture) reserve(tb testing.TB, remote string, sig decision.Signal, n int64) (release func()) {
	tb.Helper()
	ctx := context.Background()
	before := a.stats().Reserved
	t, v := a.adm.Admit(ctx, admission.Request{
		Protocol: admission.ProtocolHTTP, Signal: sig, Remote: netip.MustParseAddr(remote), Length: n,
	})
	require.Equal(tb, decision.VerdictAdmit, v)
	t.Start(ctx, nil, false)
	body, buf := bytes.NewReader(make([]byte, n)), make([]byte, n)
	for read := int64(0); read < n; {
		m, err := t.Read(body, buf[read:])
		require.NoError(tb, err)
		read += int64(m)
	}
	require.Equal(tb, before+n, a.stats().Reserved, "a body read to its length holds its length")
	return func() { t.Release(false) }
}

// callSize is what a gRPC call holds from before its message is read until
// it is decoded, with the default grpc_max_message_size and a budget of
// budget bytes: at most a quarter of the budget.
func callSize(budget int64) int64 {
	return min(int64(admission.DefaultGRPCMaxMessageSize), budget/4)
}
