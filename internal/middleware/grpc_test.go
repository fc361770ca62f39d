// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

const (
	traceExport = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
	pushMethod  = "/test.Stream/Push"
	watchMethod = "/grpc.health.v1.Health/Watch"
	missingCall = "/test.Missing/Call"
)

type traceServer struct {
	ptraceotlp.UnimplementedGRPCServer
	calls atomic.Int64
}

func (s *traceServer) Export(context.Context, ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	s.calls.Add(1)
	return ptraceotlp.NewExportResponse(), nil
}

// pushServer is a client-streaming service: it counts calls and messages and
// can hold a call open until released.
type pushServer struct {
	calls    atomic.Int64
	messages atomic.Int64
	hold     chan struct{} // when non-nil, wait for it to close before answering
	entered  chan struct{}
}

var pushDesc = grpc.ServiceDesc{
	ServiceName: "test.Stream",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Push",
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			s := srv.(*pushServer)
			s.calls.Add(1)
			if s.entered != nil {
				s.entered <- struct{}{}
			}
			for {
				err := ss.RecvMsg(new(wrapperspb.BytesValue))
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				s.messages.Add(1)
			}
			if s.hold != nil {
				<-s.hold
			}
			return ss.SendMsg(&emptypb.Empty{})
		},
	}},
}

// payloadCounter is a second, test-only stats handler: it proves that a
// rejected RPC's message is never received.
type payloadCounter struct{ in atomic.Int64 }

func (p *payloadCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}

func (p *payloadCounter) HandleRPC(_ context.Context, rs stats.RPCStats) {
	if _, ok := rs.(*stats.InPayload); ok {
		p.in.Add(1)
	}
}

func (p *payloadCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (p *payloadCounter) HandleConn(context.Context, stats.ConnStats) {}

type grpcFixture struct {
	dec    *fakeDecider
	rec    *countingRecorder
	budget *Budget
	// highWater watches budget from the start.
	highWater *HighWater
	mw        *GRPC
	traces    *traceServer
	push      *pushServer
	payloads  *payloadCounter
	conn      *grpc.ClientConn
	addr      string
}

func newGRPCFixture(t *testing.T, budget *Budget, unknownSize int64, edit ...func(*Config)) *grpcFixture {
	t.Helper()
	return newGRPCFixtureWith(t, budget, unknownSize, nil, edit...)
}

// newGRPCFixtureWith is newGRPCFixture with more server options after the
// middleware's (an authenticating interceptor, say).
func newGRPCFixtureWith(t *testing.T, budget *Budget, unknownSize int64, extra []grpc.ServerOption, edit ...func(*Config)) *grpcFixture {
	t.Helper()
	f := &grpcFixture{
		dec: &fakeDecider{}, rec: &countingRecorder{}, budget: budget, highWater: budget.WatchHighWater(),
		traces: &traceServer{}, push: &pushServer{}, payloads: &payloadCounter{},
	}
	cls := mustClassifier(t, Routes{GRPC: map[string]decision.Signal{
		pushMethod:  decision.SignalLogs,
		watchMethod: decision.SignalMetrics,
		missingCall: decision.SignalProfiles,
	}})
	cfg := Config{
		Classifier: cls, Decider: f.dec, Budget: budget, UnknownSize: unknownSize, Recorder: f.rec,
		Retry: NewRetryDelay(grpcRetryLow, grpcRetryHigh, nil, nil),
	}
	for _, e := range edit {
		e(&cfg)
	}
	mw, err := NewGRPC(cfg)
	require.NoError(t, err)
	f.mw = mw

	srv := grpc.NewServer(append(append(mw.ServerOptions(), grpc.StatsHandler(f.payloads)), extra...)...)
	ptraceotlp.RegisterGRPCServer(srv, f.traces)
	srv.RegisterService(&pushDesc, f.push)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	f.conn, f.addr = conn, ln.Addr().String()
	t.Cleanup(func() {
		conn.Close()
		hs.Shutdown()
		srv.Stop()
		<-served
	})
	return f
}

func (f *grpcFixture) export(ctx context.Context) error {
	td := ptrace.NewTraces()
	td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetName("span")
	_, err := ptraceotlp.NewGRPCClient(f.conn).Export(ctx, ptraceotlp.NewExportRequestFromTraces(td))
	return err
}

func (f *grpcFixture) pushStream(ctx context.Context) (grpc.ClientStream, error) {
	return f.conn.NewStream(ctx, &pushDesc.Streams[0], pushMethod)
}

// pushAll sends msgs messages of size bytes on one stream and waits for the
// answer.
func (f *grpcFixture) pushAll(ctx context.Context, msgs, size int) error {
	return f.pushAllOn(ctx, f.conn, msgs, size)
}

// pushAllOn is pushAll on another client connection.
func (f *grpcFixture) pushAllOn(ctx context.Context, cc *grpc.ClientConn, msgs, size int) error {
	cs, err := cc.NewStream(ctx, &pushDesc.Streams[0], pushMethod)
	if err != nil {
		return err
	}
	for range msgs {
		if err := cs.SendMsg(wrapperspb.Bytes(make([]byte, size))); err != nil {
			break // the real error comes from RecvMsg
		}
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	return cs.RecvMsg(new(emptypb.Empty))
}

// grpcRetryLow and grpcRetryHigh are the retry delay range of the gRPC
// fixture.
const (
	grpcRetryLow  = 2 * time.Second
	grpcRetryHigh = 9 * time.Second
)

// requireRetryable asserts err is RESOURCE_EXHAUSTED with a RetryInfo delay
// in [grpcRetryLow, hi].
func requireRetryable(t *testing.T, err error, reason string, hi time.Duration) {
	t.Helper()
	st, ok := status.FromError(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", err)
	assert.Equal(t, "throttle: collector overloaded ("+reason+")", st.Message())
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	require.NotNil(t, info, "RetryInfo detail")
	d := info.GetRetryDelay().AsDuration()
	assert.GreaterOrEqual(t, d, grpcRetryLow)
	assert.LessOrEqual(t, d, hi)
	assert.Zero(t, d%time.Second)
}

func (f *grpcFixture) requireReleased(t *testing.T) {
	t.Helper()
	// *stats.End runs after the client has its answer: wait for it.
	require.Eventually(t, func() bool { return f.budget.Reserved() == 0 }, 10*time.Second, time.Millisecond)
}

func TestGRPCAdmit(t *testing.T) {
	f := newGRPCFixture(t, NewBudget(1<<20), 0)
	ctx := context.Background()
	require.NoError(t, f.export(ctx))
	// The budget holds one RPC of unknown size: let the first one end.
	f.requireReleased(t)
	require.NoError(t, f.pushAll(ctx, 3, 100))
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.EqualValues(t, 3, f.push.messages.Load())
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalLogs, decision.VerdictAdmit))
	f.requireReleased(t)
	assert.EqualValues(t, DefaultUnknownSize, f.highWater.Load(), "the first RPC reserves unknown_size")
}

func TestGRPCRejectUnary(t *testing.T) {
	for _, v := range []decision.Verdict{decision.VerdictDenyShed, decision.VerdictDenyOpen} {
		t.Run(v.Reason(), func(t *testing.T) {
			f := newGRPCFixture(t, NewBudget(1<<20), 0)
			f.dec.set(decision.SignalTraces, v)
			for range 20 {
				requireRetryable(t, f.export(context.Background()), v.Reason(), grpcRetryHigh)
			}
			assert.Zero(t, f.traces.calls.Load(), "the handler is never called")
			assert.Zero(t, f.payloads.in.Load(), "the message is never received")
			assert.EqualValues(t, 20, f.rec.get(ProtocolGRPC, decision.SignalTraces, v))
			assert.Zero(t, f.highWater.Load(), "a rejected RPC reserves nothing")
		})
	}
}

func TestGRPCRejectStreaming(t *testing.T) {
	f := newGRPCFixture(t, nil, 0)
	f.dec.set(decision.SignalLogs, decision.VerdictDenyShed)
	f.dec.set(decision.SignalMetrics, decision.VerdictDenyOpen)
	ctx := context.Background()

	// Client streaming.
	requireRetryable(t, f.pushAll(ctx, 5, 1000), "shed", grpcRetryHigh)
	assert.Zero(t, f.push.calls.Load())

	// Server streaming (health Watch, routed as metrics).
	ws, err := healthpb.NewHealthClient(f.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = ws.Recv()
	requireRetryable(t, err, "open", grpcRetryHigh)
	assert.Zero(t, f.payloads.in.Load(), "no rejected message is received")

	// An unrouted method on the same server is never rejected.
	f.dec.setAll(decision.VerdictDenyOpen)
	_, err = healthpb.NewHealthClient(f.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)

	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalLogs, decision.VerdictDenyShed))
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalMetrics, decision.VerdictDenyOpen))
	assert.EqualValues(t, 2, f.rec.total())
}

// TestGRPCExempt: an exempt signal is admitted in Open (only the memory
// backstop refuses it) and bounded by the admission budget, with an
// overdraft of a second budget that the others filling it cannot take.
func TestGRPCExempt(t *testing.T) {
	b := NewBudget(1 << 20)
	f := newGRPCFixture(t, b, 0)
	f.dec.setAll(decision.VerdictDenyOpen)
	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	f.dec.exempt[decision.SignalTraces].Store(true)
	require.NoError(t, f.export(context.Background()), "an exempt signal is admitted in Open")
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictAdmit))
	f.requireReleased(t)
	require.True(t, b.Reserve(1<<20), "the others fill the budget")
	require.NoError(t, f.export(context.Background()), "an exempt call fits in the overdraft")
	b.charge(1<<20, 0) // and the overdraft
	requireRetryable(t, f.export(context.Background()), "budget", grpcRetryLow)
	b.release(1<<20, 0)
	b.Release(1 << 20)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen) // the memory backstop
	assert.Equal(t, codes.ResourceExhausted, status.Code(f.export(context.Background())))
}

// TestGRPCBudget: a stream that opens and sends nothing holds its
// reservation; with the budget full the next RPC is refused with the short
// delay; when the stream goes away, everything is released.
func TestGRPCBudget(t *testing.T) {
	f := newGRPCFixture(t, NewBudget(1000), 1000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	idle, err := f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.budget.Reserved() == 1000 }, 10*time.Second, time.Millisecond)

	// BudgetRetryDelay (1s) clamped up to the range's minimum of 2s.
	requireRetryable(t, f.export(context.Background()), "budget", grpcRetryLow)
	ws, err := healthpb.NewHealthClient(f.conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = ws.Recv()
	requireRetryable(t, err, "budget", grpcRetryLow)
	assert.Zero(t, f.traces.calls.Load())
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalMetrics, decision.VerdictDenyBudget))

	cancel()
	_ = idle.RecvMsg(new(emptypb.Empty))
	f.requireReleased(t)
	require.NoError(t, f.export(context.Background()))
	f.requireReleased(t)
	assert.EqualValues(t, 1000, f.highWater.Load())
}

// TestGRPCBudgetHeldUntilEnd: the reservation lasts until the handler
// returns, not until the client gives up.
func TestGRPCBudgetHeldUntilEnd(t *testing.T) {
	f := newGRPCFixture(t, NewBudget(1000), 1000)
	f.push.hold = make(chan struct{})
	f.push.entered = make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- f.pushAll(ctx, 1, 10) }()
	<-f.push.entered
	require.Eventually(t, func() bool { return f.push.messages.Load() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.Error(t, <-errc)
	// The client is gone but the handler still runs: the bytes stay reserved.
	assert.EqualValues(t, 1000, f.budget.Reserved())
	close(f.push.hold)
	f.requireReleased(t)
}

// TestGRPCUnregisteredServiceReleases: grpc-go sends no *stats.End for a
// routed method no service implements; the safety net releases anyway.
func TestGRPCUnregisteredServiceReleases(t *testing.T) {
	// Room for all ten: the net releases asynchronously, after the client
	// has its answer.
	f := newGRPCFixture(t, NewBudget(10*DefaultUnknownSize), 0)
	for range 10 {
		err := f.conn.Invoke(context.Background(), missingCall, &emptypb.Empty{}, new(emptypb.Empty))
		require.Equal(t, codes.Unimplemented, status.Code(err))
	}
	assert.EqualValues(t, 10, f.rec.get(ProtocolGRPC, decision.SignalProfiles, decision.VerdictAdmit))
	f.requireReleased(t)
}

// loopback is the peer slot of the fixtures' clients.
func loopback(g *GRPC) peer { return g.peers.ofRemote("127.0.0.1:1") }

// TestGRPCEstimate: received message sizes of accepted calls feed the
// per-peer, per-signal estimate that later RPCs of that peer reserve.
func TestGRPCEstimate(t *testing.T) {
	f := newGRPCFixture(t, NewBudget(1<<30), 0)
	assert.EqualValues(t, DefaultUnknownSize, f.mw.sizeEstimate(decision.SignalLogs, loopback(f.mw)))
	require.NoError(t, f.pushAll(context.Background(), 10, 10000))
	f.requireReleased(t)
	est := f.mw.sizeEstimate(decision.SignalLogs, loopback(f.mw))
	// 10000 bytes of payload plus a few bytes of protobuf framing.
	assert.InDelta(t, 10000, est, 16)
	assert.EqualValues(t, DefaultUnknownSize, f.mw.sizeEstimate(decision.SignalTraces, loopback(f.mw)), "per signal")
	assert.EqualValues(t, DefaultUnknownSize, f.mw.sizeEstimate(decision.SignalLogs, f.mw.peers.ofRemote("192.0.2.1:1")), "per peer")

	// The next RPC reserves the estimate.
	f.push.hold = make(chan struct{})
	f.push.entered = make(chan struct{}, 1)
	errc := make(chan error, 1)
	go func() { errc <- f.pushAll(context.Background(), 1, 10) }()
	<-f.push.entered
	assert.Equal(t, est, f.budget.Reserved())
	close(f.push.hold)
	require.NoError(t, <-errc)
	f.requireReleased(t)
}

// TestGRPCTapSafetyNet drives the tap directly: a stream whose context is
// already done (grpc-go aborts it right after the tap, with no stats at
// all) gets its reservation back.
func TestGRPCTapSafetyNet(t *testing.T) {
	b := NewBudget(1 << 20)
	mw, err := NewGRPC(Config{Classifier: mustClassifier(t, Routes{}), Decider: &fakeDecider{}, Budget: b})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = mw.tap(ctx, &tap.Info{FullMethodName: traceExport})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.Reserved() == 0 }, 10*time.Second, time.Millisecond)

	// Begin stops the net: a later cancellation no longer releases, End does.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	rctx, err := mw.tap(ctx, &tap.Info{FullMethodName: traceExport})
	require.NoError(t, err)
	h := grpcStats{mw}
	h.HandleRPC(rctx, &stats.Begin{})
	cancel()
	assert.EqualValues(t, DefaultUnknownSize, b.Reserved())
	h.HandleRPC(rctx, &stats.End{})
	assert.Zero(t, b.Reserved())
	h.HandleRPC(rctx, &stats.End{})
	assert.Zero(t, b.Reserved(), "released once")
}

func TestGRPCObserve(t *testing.T) {
	mw, err := NewGRPC(Config{Classifier: mustClassifier(t, Routes{}), Decider: &fakeDecider{}, Budget: NewBudget(1 << 20), UnknownSize: 5000})
	require.NoError(t, err)
	h := grpcStats{mw}
	call := func(sig decision.Signal, size int, err error) {
		r := &reservation{b: mw.budget, sig: sig, cancel: func() {}}
		ctx := context.WithValue(context.Background(), reservationKey{}, r)
		h.HandleRPC(ctx, &stats.InPayload{Length: size})
		h.HandleRPC(ctx, &stats.End{Error: err})
	}
	in := func(sig decision.Signal, size int) { call(sig, size, nil) }
	assert.EqualValues(t, 5000, mw.sizeEstimate(decision.SignalTraces, 0), "unknown_size before any message")
	call(decision.SignalTraces, 900000, status.Error(codes.Unauthenticated, "no"))
	assert.EqualValues(t, 5000, mw.sizeEstimate(decision.SignalTraces, 0), "a call that ended in an error teaches nothing")
	in(decision.SignalTraces, 8000)
	assert.EqualValues(t, 8000, mw.sizeEstimate(decision.SignalTraces, 0))
	in(decision.SignalTraces, 1600)
	assert.EqualValues(t, 8000, mw.sizeEstimate(decision.SignalTraces, 0), "the largest recent message, not an average")
	in(decision.SignalLogs, 0)
	assert.EqualValues(t, minEstimate, mw.sizeEstimate(decision.SignalLogs, 0), "an empty message is data too, counted as the floor")
	in(decision.SignalMetrics, 10<<20)
	assert.EqualValues(t, 1<<20, mw.sizeEstimate(decision.SignalMetrics, 0), "capped at the budget")
	assert.Zero(t, mw.budget.Reserved())
}

// TestSizeWindow: the estimate is the largest size of the current and the
// previous 10s window; it forgets a size after two windows, or at once
// after a window without any.
func TestSizeWindow(t *testing.T) {
	var w sizeWindow
	assert.Zero(t, w.get(0))
	w.observe(8000, time.Second)
	w.observe(100, 2*time.Second)
	assert.EqualValues(t, 8000, w.get(3*time.Second))
	assert.EqualValues(t, 8000, w.get(15*time.Second), "kept through the next window")
	w.observe(300, 16*time.Second)
	assert.EqualValues(t, 300, w.get(25*time.Second), "forgotten after two windows")
	assert.Zero(t, w.get(45*time.Second), "a window without any size in between")
	w.observe(0, 46*time.Second)
	assert.EqualValues(t, 1, w.get(46*time.Second), "an empty request is data")
}

// TestGRPCEstimateNotPoisoned: a hundred empty messages after a large one
// do not lower what the next RPC of that signal reserves (a running
// average fell to one byte and no longer bounded anything).
func TestGRPCEstimateNotPoisoned(t *testing.T) {
	f := newGRPCFixture(t, NewBudget(1<<20), 4<<10)
	ctx := context.Background()
	require.NoError(t, f.pushAll(ctx, 1, 200<<10))
	for range 100 {
		require.NoError(t, f.pushAll(ctx, 1, 0))
	}
	f.requireReleased(t)

	f.push.hold = make(chan struct{})
	f.push.entered = make(chan struct{}, 1)
	errc := make(chan error, 1)
	go func() { errc <- f.pushAll(ctx, 1, 10) }()
	<-f.push.entered
	assert.GreaterOrEqual(t, f.budget.Reserved(), int64(200<<10), "the next stream reserves the large message's size")
	close(f.push.hold)
	require.NoError(t, <-errc)
	f.requireReleased(t)
}

// TestGRPCReservationGrowsToMessage: a message larger than its RPC's
// reservation is charged in full once it has arrived, so while it is
// handled the budget shows it and refuses other RPCs.
func TestGRPCReservationGrowsToMessage(t *testing.T) {
	f := newGRPCFixture(t, NewBudget(256<<10), 1<<10)
	ctx := context.Background()
	f.push.hold = make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- f.pushAll(ctx, 1, 300<<10) }()
	require.Eventually(t, func() bool { return f.push.messages.Load() == 1 }, 10*time.Second, time.Millisecond)
	assert.GreaterOrEqual(t, f.budget.Reserved(), int64(300<<10), "the message being handled is charged")
	requireRetryable(t, f.export(ctx), "budget", grpcRetryLow)
	close(f.push.hold)
	require.NoError(t, <-errc)
	f.requireReleased(t)
	require.NoError(t, f.export(ctx))
}

// withQueue holds what the budget cannot take yet, as the extension does
// by default.
func withQueue(dec Decider) func(*Config) {
	return func(c *Config) { c.Hold = NewHold(dec, nil, 5*time.Second, 8, 0) }
}

// fullBudgetFixture is a fixture with the queue on, holding for up to
// wait, and a budget of 1000 bytes that waits up to wait too, all of it
// held by an idle stream; release ends that stream.
func fullBudgetFixture(t *testing.T, wait time.Duration) (f *grpcFixture, release func()) {
	t.Helper()
	budget := NewBudgetWith(BudgetConfig{Max: 1000, Wait: wait})
	dec := &fakeDecider{}
	f = newGRPCFixture(t, budget, 1000, func(c *Config) {
		c.Decider = dec
		c.Hold = NewHold(dec, nil, wait, 8, 0)
	})
	f.dec = dec
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	idle, err := f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return budget.Reserved() == 1000 }, 10*time.Second, time.Millisecond)
	return f, func() {
		cancel()
		_ = idle.RecvMsg(new(emptypb.Empty))
	}
}

// TestGRPCBudgetWaitsForBytes: with the queue on, an RPC that finds the
// budget full is not refused at the tap: its handler waits for the bytes
// and runs once they are released, and the exporter never sees a refusal.
func TestGRPCBudgetWaitsForBytes(t *testing.T) {
	f, release := fullBudgetFixture(t, 5*time.Second)

	errc := make(chan error, 1)
	go func() { errc <- f.export(context.Background()) }()
	require.Eventually(t, func() bool { return f.mw.hold.Held() == 1 }, 10*time.Second, time.Millisecond)
	assert.Zero(t, f.traces.calls.Load(), "the waiting RPC's handler must not run before it has its bytes")

	release()
	require.NoError(t, <-errc)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.Zero(t, f.mw.hold.Held())
	f.requireReleased(t)
}

// TestGRPCBudgetWaitEnds: an RPC that waited the budget's wait without
// getting its bytes is refused before its handler runs, counted as a
// budget refusal, and holds nothing afterwards.
func TestGRPCBudgetWaitEnds(t *testing.T) {
	f, release := fullBudgetFixture(t, 200*time.Millisecond)
	// CANCELLED when the message was still unread, else the refusal the
	// tap answers; the OTLP exporters retry both.
	err := f.export(context.Background())
	if code := status.Code(err); code != codes.Canceled {
		requireRetryable(t, err, "budget", grpcRetryLow)
	}
	assert.Zero(t, f.traces.calls.Load())
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.Zero(t, f.mw.hold.Held())
	require.Eventually(t, func() bool { return f.budget.Reserved() == 1000 }, 10*time.Second, time.Millisecond, "only the idle stream's bytes")

	release()
	f.requireReleased(t)
}

// TestGRPCEstimateWireSize: compressed messages reserve their size on the
// wire, as an HTTP body its Content-Length, but never less than a quarter
// of their decoded size; the reservation grows to the decoded size once
// the message has arrived.
func TestGRPCEstimateWireSize(t *testing.T) {
	f := newGRPCFixture(t, NewBudget(8<<20), 4<<10)
	ctx := context.Background()
	gz, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name)))
	require.NoError(t, err)
	defer gz.Close()

	// Random bytes do not compress: wire size and decoded size agree.
	random := make([]byte, 400<<10)
	_, _ = rand.Read(random)
	require.NoError(t, sendOn(ctx, gz, random))
	f.requireReleased(t)
	assert.InDelta(t, 400<<10, f.mw.sizeEstimate(decision.SignalLogs, loopback(f.mw)), 1<<10)

	// Zeros compress a thousandfold: the floor, a quarter of the decoded size.
	f2 := newGRPCFixture(t, NewBudget(8<<20), 4<<10)
	gz2, err := grpc.NewClient(f2.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name)))
	require.NoError(t, err)
	defer gz2.Close()
	f2.push.hold = make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- sendOn(ctx, gz2, make([]byte, 400<<10)) }()
	require.Eventually(t, func() bool { return f2.push.messages.Load() == 1 }, 10*time.Second, time.Millisecond)
	assert.GreaterOrEqual(t, f2.budget.Reserved(), int64(400<<10), "grown to the decoded size while handled")
	close(f2.push.hold)
	require.NoError(t, <-errc)
	f2.requireReleased(t)
	assert.InDelta(t, 100<<10, f2.mw.sizeEstimate(decision.SignalLogs, loopback(f2.mw)), 1<<10)
}

// sendOn sends one message of the given bytes on a push stream of cc.
func sendOn(ctx context.Context, cc *grpc.ClientConn, b []byte) error {
	cs, err := cc.NewStream(ctx, &pushDesc.Streams[0], pushMethod)
	if err != nil {
		return err
	}
	if err := cs.SendMsg(wrapperspb.Bytes(b)); err != nil {
		return cs.RecvMsg(new(emptypb.Empty))
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	return cs.RecvMsg(new(emptypb.Empty))
}

// TestGRPCShedWaitsForDecision: with the queue on, a shed RPC is not
// refused at the tap: it waits, its handler not started, and runs once a
// later decision admits it, so the exporter never sees a refusal (and
// never backs off).
func TestGRPCShedWaitsForDecision(t *testing.T) {
	budget := NewBudget(1 << 20)
	dec := &fakeDecider{}
	f := newGRPCFixture(t, budget, 1000, func(c *Config) { c.Decider = dec }, withQueue(dec))
	dec.set(decision.SignalTraces, decision.VerdictDenyShed)

	errc := make(chan error, 1)
	go func() { errc <- f.export(context.Background()) }()
	require.Eventually(t, func() bool { return f.mw.hold.Held() == 1 }, 10*time.Second, time.Millisecond)
	assert.Zero(t, f.traces.calls.Load(), "a held RPC's handler must not run")
	assert.Zero(t, f.payloads.in.Load(), "a held RPC's message is not read")
	assert.Zero(t, budget.Reserved(), "a held RPC holds no budget")

	dec.set(decision.SignalTraces, decision.VerdictAdmit)
	require.NoError(t, <-errc)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyShed))
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.Zero(t, f.mw.hold.Held())
	assert.EqualValues(t, 1000, f.highWater.Load(), "admitted, it reserves as at the tap")
	f.requireReleased(t)
}

// TestGRPCShedWaitEnds: a shed RPC that no decision admits within the
// queue's max_wait is refused before its handler runs, counted once as
// shed, and holds nothing afterwards.
func TestGRPCShedWaitEnds(t *testing.T) {
	dec := &fakeDecider{}
	f := newGRPCFixture(t, NewBudget(1<<20), 1000, func(c *Config) {
		c.Decider = dec
		c.Hold = NewHold(dec, nil, 200*time.Millisecond, 8, 0)
	})
	dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	err := f.export(context.Background())
	// CANCELLED when the message was still unread, else the refusal the
	// tap answers; the OTLP exporters retry both.
	if code := status.Code(err); code != codes.Canceled {
		requireRetryable(t, err, "shed", grpcRetryHigh)
	}
	assert.Zero(t, f.traces.calls.Load())
	assert.EqualValues(t, 1, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyShed))
	assert.EqualValues(t, 1, f.rec.total())
	assert.Zero(t, f.mw.hold.Held())
	f.requireReleased(t)
}

// TestGRPCOpenHeld: in Open a gRPC call waits for a decision that admits
// it, as a shed one does, within its deadline: some clients (the
// JavaScript SDK's gRPC exporter) retry no refusal at all, and the SDKs'
// whole export, retries included, must fit in 10 s. Its expected message
// is counted in the budget's held pool while it waits (grpc-go buffers
// it); a call that finds every place of the queue taken, or the held pool
// full, is refused at the tap (issue 28 point 3).
func TestGRPCOpenHeld(t *testing.T) {
	dec := &fakeDecider{}
	b := NewBudget(1 << 20)
	f := newGRPCFixture(t, b, 1000, func(c *Config) {
		c.Decider = dec
		c.Hold = NewHold(dec, nil, time.Minute, 1, 0)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	held := make(chan error, 1)
	go func() { held <- f.export(ctx) }()
	require.Eventually(t, func() bool { return f.mw.hold.Held() == 1 }, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 1000, b.Held(), "its expected message is counted while it waits")

	dec.set(decision.SignalLogs, decision.VerdictDenyShed)
	requireRetryable(t, f.pushAll(ctx, 1, 10), "shed", grpcRetryHigh)
	assert.Zero(t, f.push.messages.Load(), "the only place is taken: refused at the tap")

	dec.set(decision.SignalTraces, decision.VerdictAdmit) // the Open ends
	require.NoError(t, <-held)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, b.Held())
	f.requireReleased(t)

	// The held pool is as large as the budget: a call whose expected
	// message does not fit in what is left of it is refused at once.
	f2 := newGRPCFixture(t, NewBudget(1000), 1000, func(c *Config) {
		c.Decider = dec
		c.Hold = NewHold(dec, nil, time.Minute, 8, 0)
	})
	dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	go func() { held <- f2.export(ctx) }()
	require.Eventually(t, func() bool { return f2.budget.Held() == 1000 }, 10*time.Second, time.Millisecond)
	requireRetryable(t, f2.export(ctx), "open", grpcRetryHigh)
	assert.EqualValues(t, 1, f2.mw.hold.Held())
	// The pool may be larger than the budget (the runner sizes it by the
	// memory limit): then a second call waits too.
	f2.budget.SetHeldMax(2000)
	held2 := make(chan error, 1)
	go func() { held2 <- f2.export(ctx) }()
	require.Eventually(t, func() bool { return f2.budget.Held() == 2000 }, 10*time.Second, time.Millisecond)
	dec.set(decision.SignalTraces, decision.VerdictAdmit)
	require.NoError(t, <-held)
	require.NoError(t, <-held2)
	f2.requireReleased(t)
}

// TestGRPCShedThenBudget: a held RPC admitted by a later decision while the
// budget is full waits for its bytes too, and runs once they are free.
func TestGRPCShedThenBudget(t *testing.T) {
	f, release := fullBudgetFixture(t, 5*time.Second)
	dec := f.dec
	dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	errc := make(chan error, 1)
	go func() { errc <- f.export(context.Background()) }()
	require.Eventually(t, func() bool { return f.mw.hold.Held() == 1 }, 10*time.Second, time.Millisecond)
	dec.set(decision.SignalTraces, decision.VerdictAdmit)
	// Admitted by the decision, it now waits for the budget, still held.
	require.Never(t, func() bool { return f.traces.calls.Load() > 0 }, 300*time.Millisecond, 10*time.Millisecond)
	assert.EqualValues(t, 1, f.mw.hold.Held())

	release()
	require.NoError(t, <-errc)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyShed))
	assert.Zero(t, f.rec.get(ProtocolGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.mw.hold.Held())
	f.requireReleased(t)
}

// TestGRPCWaitEndsBeforeDeadline: a waiting stream is refused before the
// time its client gave it has passed (deadlineShare of it, leaving at least
// deadlineMargin), however long the queue's max_wait, so that its client
// gets a refusal rather than a deadline it gives up on while the collector
// takes the data (a duplicate once the client sends it again).
func TestGRPCWaitEndsBeforeDeadline(t *testing.T) {
	for _, shed := range []bool{true, false} {
		t.Run(map[bool]string{true: "shed", false: "budget"}[shed], func(t *testing.T) {
			f, release := fullBudgetFixture(t, 30*time.Second)
			defer release()
			if shed {
				f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			err := f.export(ctx)
			require.Error(t, err)
			assert.NotEqual(t, codes.DeadlineExceeded, status.Code(err), "refused before the client's deadline: %v", err)
			assert.Zero(t, f.traces.calls.Load())
			assert.Zero(t, f.mw.hold.Held())
		})
	}
}
