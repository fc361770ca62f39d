// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/netip"
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

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

const (
	traceExport = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
	pushMethod  = "/test.Stream/Push"
	sendMethod  = "/test.Stream/Send"
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

func pushHandler(srv any, ss grpc.ServerStream) error {
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
}

// pushDesc has two client-streaming methods, routed as logs (Push) and
// metrics (Send).
var pushDesc = grpc.ServiceDesc{
	ServiceName: "test.Stream",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{
		{StreamName: "Push", ClientStreams: true, Handler: pushHandler},
		{StreamName: "Send", ClientStreams: true, Handler: pushHandler},
	},
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
	*admFixture
	mw       *GRPC
	traces   *traceServer
	push     *pushServer
	payloads *payloadCounter
	conn     *grpc.ClientConn
	addr     string
}

// newGRPCFixture is a gRPC server with the middleware on a new admission
// (see newAdm), serving traces, the push streams (logs and metrics) and
// health (Watch routed as metrics), and a client connection to it.
func newGRPCFixture(t *testing.T, budget int64, opts ...admOption) *grpcFixture {
	t.Helper()
	return newGRPCFixtureOn(t, newAdm(t, budget, opts...))
}

// newGRPCFixtureOn is newGRPCFixture on the admission a, with more server
// options after the middleware's (an authenticating interceptor, say).
func newGRPCFixtureOn(t *testing.T, a *admFixture, extra ...grpc.ServerOption) *grpcFixture {
	t.Helper()
	f := &grpcFixture{admFixture: a, traces: &traceServer{}, push: &pushServer{}, payloads: &payloadCounter{}}
	f.mw = newGRPCMiddleware(t, a)

	srv := grpc.NewServer(append(append(f.mw.ServerOptions(), grpc.StatsHandler(f.payloads)), extra...)...)
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

// newGRPCMiddleware is the gRPC middleware on a, with the fixtures' routes
// and retry delays.
func newGRPCMiddleware(tb testing.TB, a *admFixture) *GRPC {
	tb.Helper()
	cfg := Config{
		Classifier: mustClassifier(tb, Routes{GRPC: map[string]decision.Signal{
			pushMethod:  decision.SignalLogs,
			sendMethod:  decision.SignalMetrics,
			watchMethod: decision.SignalMetrics,
			missingCall: decision.SignalProfiles,
		}}),
		Admission: a.adm,
		Retry:     NewRetryDelay(grpcRetryLow, grpcRetryHigh, nil, nil),
	}
	for _, e := range a.setup.mw {
		e(&cfg)
	}
	mw, err := NewGRPC(cfg)
	require.NoError(tb, err)
	return mw
}

func (f *grpcFixture) export(ctx context.Context) error {
	return exportOn(ctx, f.conn)
}

// exportOn exports one span on cc.
func exportOn(ctx context.Context, cc *grpc.ClientConn) error {
	td := ptrace.NewTraces()
	td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetName("span")
	_, err := ptraceotlp.NewGRPCClient(cc).Export(ctx, ptraceotlp.NewExportRequestFromTraces(td))
	return err
}

// pushStream opens a logs stream that sends nothing until told.
func (f *grpcFixture) pushStream(ctx context.Context) (grpc.ClientStream, error) {
	return f.conn.NewStream(ctx, &pushDesc.Streams[0], pushMethod)
}

// sendStream opens a metrics stream that sends nothing until told.
func (f *grpcFixture) sendStream(ctx context.Context) (grpc.ClientStream, error) {
	return f.conn.NewStream(ctx, &pushDesc.Streams[1], sendMethod)
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

// requireRefused asserts a call whose wait ended in a refusal: CANCELLED
// when its message was still unread, else the refusal the gate answers;
// the OTLP exporters retry both.
func requireRefused(t *testing.T, err error, reason string, hi time.Duration) {
	t.Helper()
	if status.Code(err) != codes.Canceled {
		requireRetryable(t, err, reason, hi)
	}
}

// requireReleased waits until every call has ended and given its bytes
// back: *stats.End runs after the client has its answer.
func (a *admFixture) requireReleased(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { s := a.stats(); return s.Reserved == 0 && s.Inflight == 0 },
		10*time.Second, time.Millisecond)
}

// tapEstimate is what a call of method from remote reserves at the tap
// (its key and signal's estimate): the call then goes away before its
// handler starts, and the tap's safety net releases it.
func (f *grpcFixture) tapEstimate(t *testing.T, method, remote string) int64 {
	t.Helper()
	before := f.stats().Reserved
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), peerKey{}, netip.MustParseAddr(remote)))
	_, err := f.mw.tap(ctx, &tap.Info{FullMethodName: method})
	require.NoError(t, err)
	est := f.stats().Reserved - before
	cancel()
	require.Eventually(t, func() bool { return f.stats().Reserved == before }, 10*time.Second, time.Millisecond)
	return est
}

func TestGRPCAdmit(t *testing.T) {
	f := newGRPCFixture(t, 8<<20)
	ctx := context.Background()
	require.NoError(t, f.export(ctx))
	f.requireReleased(t)
	require.NoError(t, f.pushAll(ctx, 3, 100))
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.EqualValues(t, 3, f.push.messages.Load())
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalLogs, decision.VerdictAdmit))
	assert.EqualValues(t, 2, f.rec.total())
	f.requireReleased(t)
	assert.Equal(t, callSize(8<<20), f.stats().Peak,
		"before its message is read, a call holds what grpc-go may decode for it, at most a quarter of the budget")
}

func TestGRPCRejectUnary(t *testing.T) {
	for _, v := range []decision.Verdict{decision.VerdictDenyShed, decision.VerdictDenyOpen} {
		t.Run(v.Reason(), func(t *testing.T) {
			f := newGRPCFixture(t, 8<<20)
			f.dec.set(decision.SignalTraces, v)
			for range 20 {
				requireRetryable(t, f.export(context.Background()), v.Reason(), grpcRetryHigh)
			}
			assert.Zero(t, f.traces.calls.Load(), "the handler is never called")
			assert.Zero(t, f.payloads.in.Load(), "the message is never received")
			assert.EqualValues(t, 20, f.rec.get(protoGRPC, decision.SignalTraces, v))
			assert.EqualValues(t, 20, f.rec.total())
			assert.Zero(t, f.stats().Peak, "a rejected RPC reserves nothing")
			assert.Zero(t, f.stats().Inflight)
		})
	}
}

func TestGRPCRejectStreaming(t *testing.T) {
	f := newGRPCFixture(t, 0)
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

	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalLogs, decision.VerdictDenyShed))
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalMetrics, decision.VerdictDenyOpen))
	assert.EqualValues(t, 2, f.rec.total())
}

// TestGRPCExempt: an exempt signal is admitted in Open (only the memory
// backstop refuses it) and bounded by the admission budget: the other
// signals may take three quarters of it, so that filling it does not
// refuse the exempt ones, which may take all of it and nothing more.
func TestGRPCExempt(t *testing.T) {
	const call = int64(admission.DefaultGRPCMaxMessageSize)
	const budget = 4 * call
	f := newGRPCFixture(t, budget, withExempt(decision.SignalLogs))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.dec.setAll(decision.VerdictDenyOpen)
	f.dec.set(decision.SignalLogs, decision.VerdictAdmit)
	require.NoError(t, f.pushAll(ctx, 1, 10), "an exempt signal is admitted in Open")
	requireRetryable(t, f.export(ctx), "open", grpcRetryHigh)
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalLogs, decision.VerdictAdmit))
	f.requireReleased(t)

	f.dec.setAll(decision.VerdictAdmit)
	for range 3 {
		_, err := f.sendStream(ctx)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return f.stats().Reserved == 3*call }, 10*time.Second, time.Millisecond,
		"three silent metrics streams hold what their messages may decode to")
	cs, err := f.sendStream(ctx)
	require.NoError(t, err)
	requireRetryable(t, cs.RecvMsg(new(emptypb.Empty)), "budget", grpcRetryLow)

	_, err = f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.stats().Reserved == budget }, 10*time.Second, time.Millisecond,
		"the others filling what they may do not refuse an exempt stream")
	cs, err = f.pushStream(ctx)
	require.NoError(t, err)
	requireRetryable(t, cs.RecvMsg(new(emptypb.Empty)), "budget", grpcRetryLow)
	assert.Equal(t, budget, f.stats().Peak, "nothing reserves past the budget, exempt or not")
	cancel()
	f.requireReleased(t)

	f.dec.set(decision.SignalLogs, decision.VerdictDenyOpen) // the memory backstop
	requireRetryable(t, f.pushAll(context.Background(), 1, 10), "open", grpcRetryHigh)
}

// TestGRPCBudget: a stream that opens and sends nothing holds what its
// message may decode to (grpc_max_message_size, at most a quarter of the
// budget), not unknown_size; with four of them filling the budget the next
// RPC is refused at the tap with the short delay; when the streams go away,
// everything is released.
func TestGRPCBudget(t *testing.T) {
	const call = 64 << 10
	f := newGRPCFixture(t, 4*call, withMaxMessage(call), withUnknownSize(1000))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var idle grpc.ClientStream
	for i := range int64(4) {
		var err error
		idle, err = f.pushStream(ctx)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return f.stats().Reserved == (i+1)*call }, 10*time.Second, time.Millisecond)
	}

	// BudgetRetryDelay (1s) clamped up to the range's minimum of 2s.
	requireRetryable(t, f.export(context.Background()), "budget", grpcRetryLow)
	ws, err := healthpb.NewHealthClient(f.conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = ws.Recv()
	requireRetryable(t, err, "budget", grpcRetryLow)
	assert.Zero(t, f.traces.calls.Load())
	assert.Zero(t, f.payloads.in.Load())
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalMetrics, decision.VerdictDenyBudget))

	cancel()
	_ = idle.RecvMsg(new(emptypb.Empty))
	f.requireReleased(t)
	require.NoError(t, f.export(context.Background()))
	f.requireReleased(t)
	assert.EqualValues(t, 4*call, f.stats().Peak)
}

// TestGRPCBudgetHeldUntilEnd: the reservation lasts until the handler
// returns, not until the client gives up.
func TestGRPCBudgetHeldUntilEnd(t *testing.T) {
	f := newGRPCFixture(t, 1000, withUnknownSize(1000))
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
	assert.EqualValues(t, 1000, f.stats().Reserved)
	assert.EqualValues(t, 1, f.stats().Inflight)
	close(f.push.hold)
	f.requireReleased(t)
}

// TestGRPCUnregisteredServiceReleases: grpc-go sends no *stats.End for a
// routed method no service implements; the safety net releases anyway,
// and counts the call once.
func TestGRPCUnregisteredServiceReleases(t *testing.T) {
	// Room for all ten: the net releases asynchronously, after the client
	// has its answer.
	f := newGRPCFixture(t, 10*int64(admission.DefaultUnknownSize))
	for range 10 {
		err := f.conn.Invoke(context.Background(), missingCall, &emptypb.Empty{}, new(emptypb.Empty))
		require.Equal(t, codes.Unimplemented, status.Code(err))
	}
	f.requireReleased(t)
	// Counted as the net releases, just after.
	require.Eventually(t, func() bool { return f.rec.total() == 10 }, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 10, f.rec.get(protoGRPC, decision.SignalProfiles, decision.VerdictAdmit))
}

// TestGRPCEstimate: received message sizes of accepted calls feed the
// per-key, per-signal estimate that later calls of that key reserve at
// the tap (whether they are let in at once).
func TestGRPCEstimate(t *testing.T) {
	f := newGRPCFixture(t, 1<<30)
	assert.EqualValues(t, admission.DefaultUnknownSize, f.tapEstimate(t, pushMethod, "127.0.0.1"), "unknown_size at first")
	require.NoError(t, f.pushAll(context.Background(), 10, 10000))
	f.requireReleased(t)
	// 10000 bytes of payload plus a few bytes of protobuf framing.
	assert.InDelta(t, 10000, f.tapEstimate(t, pushMethod, "127.0.0.1"), 16)
	assert.EqualValues(t, admission.DefaultUnknownSize, f.tapEstimate(t, traceExport, "127.0.0.1"), "per signal")
	assert.EqualValues(t, admission.DefaultUnknownSize, f.tapEstimate(t, pushMethod, "192.0.2.1"), "per key")
}

// TestGRPCTapSafetyNet drives the tap directly: a stream whose context is
// already done (grpc-go aborts it right after the tap, with no stats at
// all) gets its reservation back.
func TestGRPCTapSafetyNet(t *testing.T) {
	a := newAdm(t, 8<<20)
	mw := newGRPCMiddleware(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := mw.tap(ctx, &tap.Info{FullMethodName: traceExport})
	require.NoError(t, err)
	a.requireReleased(t)

	// Begin stops the net: a later cancellation no longer releases, End does.
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	rctx, err := mw.tap(ctx, &tap.Info{FullMethodName: traceExport})
	require.NoError(t, err)
	h := grpcStats{mw}
	h.HandleRPC(rctx, &stats.Begin{})
	cancel()
	assert.Equal(t, callSize(a.stats().Budget), a.stats().Reserved)
	assert.EqualValues(t, 1, a.stats().Inflight)
	h.HandleRPC(rctx, &stats.End{})
	assert.Zero(t, a.stats().Reserved)
	h.HandleRPC(rctx, &stats.End{})
	assert.Zero(t, a.stats().Reserved, "released once")
	assert.Zero(t, a.stats().Inflight)
	assert.EqualValues(t, 2, a.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictAdmit), "each call counted once")
}

// TestGRPCEstimateLearnt drives the stats handler: a call's estimate is
// the largest message of accepted calls of its key and signal lately, not
// an average, at least 4 KiB, at most its key's share; a call that ended
// in an error teaches nothing.
func TestGRPCEstimateLearnt(t *testing.T) {
	f := &grpcFixture{admFixture: newAdm(t, 1<<20, withDefaultShare(), withUnknownSize(5000))}
	f.mw = newGRPCMiddleware(t, f.admFixture)
	h := grpcStats{f.mw}
	call := func(method string, size int, err error) {
		ctx := context.WithValue(context.Background(), peerKey{}, netip.MustParseAddr("127.0.0.1"))
		rctx, terr := f.mw.tap(ctx, &tap.Info{FullMethodName: method})
		require.NoError(t, terr)
		h.HandleRPC(rctx, &stats.Begin{IsClientStream: method == pushMethod})
		h.HandleRPC(rctx, &stats.InPayload{Length: size, CompressedLength: size})
		h.HandleRPC(rctx, &stats.End{Error: err})
	}
	in := func(method string, size int) { call(method, size, nil) }
	est := func(method string) int64 { return f.tapEstimate(t, method, "127.0.0.1") }
	assert.EqualValues(t, 5000, est(traceExport), "unknown_size before any message")
	call(traceExport, 900000, status.Error(codes.Unauthenticated, "no"))
	assert.EqualValues(t, 5000, est(traceExport), "a call that ended in an error teaches nothing")
	in(traceExport, 8000)
	assert.EqualValues(t, 8000, est(traceExport))
	in(traceExport, 1600)
	assert.EqualValues(t, 8000, est(traceExport), "the largest recent message, not an average")
	in(pushMethod, 0)
	assert.EqualValues(t, 4<<10, est(pushMethod), "an empty message is data too, counted as the floor")
	in(sendMethod, 10<<20)
	assert.EqualValues(t, 512<<10, est(sendMethod), "capped at the key's share")
	assert.Zero(t, f.stats().Reserved)
}

// TestGRPCEstimateNotPoisoned: a hundred empty messages after a large one
// do not lower what the next call of that signal reserves at the tap (a
// running average fell to one byte and no longer bounded anything).
func TestGRPCEstimateNotPoisoned(t *testing.T) {
	f := newGRPCFixture(t, 8<<20, withUnknownSize(4<<10))
	ctx := context.Background()
	require.NoError(t, f.pushAll(ctx, 1, 200<<10))
	for range 100 {
		require.NoError(t, f.pushAll(ctx, 1, 0))
	}
	f.requireReleased(t)
	assert.GreaterOrEqual(t, f.tapEstimate(t, pushMethod, "127.0.0.1"), int64(200<<10),
		"the next stream reserves the large message's size")
}

// TestGRPCReservationGrowsToMessage: a message larger than its call's
// reservation is charged in full once it has arrived, so while it is
// handled the budget shows it and refuses other calls.
func TestGRPCReservationGrowsToMessage(t *testing.T) {
	f := newGRPCFixture(t, 256<<10, withUnknownSize(1<<10))
	ctx := context.Background()
	f.push.hold = make(chan struct{})
	errc := make(chan error, 1)
	go func() { errc <- f.pushAll(ctx, 1, 300<<10) }()
	require.Eventually(t, func() bool { return f.push.messages.Load() == 1 }, 10*time.Second, time.Millisecond)
	assert.GreaterOrEqual(t, f.stats().Reserved, int64(300<<10), "the message being handled is charged")
	requireRetryable(t, f.export(ctx), "budget", grpcRetryLow)
	close(f.push.hold)
	require.NoError(t, <-errc)
	f.requireReleased(t)
	require.NoError(t, f.export(ctx))
}

// fullBudgetFixture is a fixture with the hold on, holding for up to wait,
// and a budget of 1000 bytes that calls wait for up to wait too, all of it
// held by an idle stream; release ends that stream.
func fullBudgetFixture(t *testing.T, wait time.Duration) (f *grpcFixture, release func()) {
	t.Helper()
	f = newGRPCFixture(t, 1000, withUnknownSize(1000), withWait(wait), withHold(wait, 8))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	idle, err := f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.stats().Reserved == 1000 }, 10*time.Second, time.Millisecond)
	return f, func() {
		cancel()
		_ = idle.RecvMsg(new(emptypb.Empty))
	}
}

// TestGRPCBudgetWaitsForBytes: with the hold on, a call that finds the
// budget full is not refused at the tap: its handler waits for the bytes
// and runs once they are released, and the exporter never sees a refusal.
func TestGRPCBudgetWaitsForBytes(t *testing.T) {
	f, release := fullBudgetFixture(t, 5*time.Second)

	errc := make(chan error, 1)
	go func() { errc <- f.export(context.Background()) }()
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 1 }, 10*time.Second, time.Millisecond)
	assert.Zero(t, f.traces.calls.Load(), "the waiting call's handler must not run before it has its bytes")

	release()
	require.NoError(t, <-errc)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.Zero(t, f.stats().HeldRequests)
	f.requireReleased(t)
}

// TestGRPCBudgetWaitEnds: a call that waited without getting its bytes is
// refused before its handler runs, counted as a budget refusal, and holds
// nothing afterwards.
func TestGRPCBudgetWaitEnds(t *testing.T) {
	f, release := fullBudgetFixture(t, 200*time.Millisecond)
	requireRefused(t, f.export(context.Background()), "budget", grpcRetryLow)
	assert.Zero(t, f.traces.calls.Load())
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.Zero(t, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.Zero(t, f.stats().HeldRequests)
	require.Eventually(t, func() bool { return f.stats().Reserved == 1000 }, 10*time.Second, time.Millisecond, "only the idle stream's bytes")

	release()
	f.requireReleased(t)
}

// TestGRPCEstimateWireSize: compressed messages are estimated by their
// size on the wire, as an HTTP body by its Content-Length, but never less
// than a quarter of their decoded size; and whatever its estimate, a call
// holds what grpc-go may decode for it until its message is decoded (one
// small message must not let the next ones in at 4 KiB each while grpc-go
// decompresses megabytes for each).
func TestGRPCEstimateWireSize(t *testing.T) {
	gzipConn := func(f *grpcFixture) *grpc.ClientConn {
		cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name)))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Random bytes do not compress: wire size and decoded size agree.
	f := newGRPCFixture(t, 8<<20, withUnknownSize(4<<10))
	random := make([]byte, 128<<10)
	_, _ = rand.Read(random)
	require.NoError(t, sendOn(ctx, gzipConn(f), random))
	f.requireReleased(t)
	assert.InDelta(t, 128<<10, f.tapEstimate(t, pushMethod, "127.0.0.1"), 1<<10)

	// Zeros compress a thousandfold: the floor, a quarter of the decoded size.
	f2 := newGRPCFixture(t, 8<<20, withUnknownSize(4<<10))
	gz2 := gzipConn(f2)
	require.NoError(t, sendOn(ctx, gz2, make([]byte, 128<<10)))
	f2.requireReleased(t)
	assert.InDelta(t, 32<<10, f2.tapEstimate(t, pushMethod, "127.0.0.1"), 1<<10)

	_, err := gz2.NewStream(ctx, &pushDesc.Streams[0], pushMethod)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f2.stats().Reserved == callSize(8<<20) },
		10*time.Second, time.Millisecond, "a call holds what its message may decode to, not its estimate")
	cancel()
	f2.requireReleased(t)
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

// TestGRPCShedWaitsForDecision: with the hold on, a shed call is not
// refused at the tap: it waits, its handler not started and its message
// unread, and runs once a later decision admits it, so the exporter never
// sees a refusal (and never backs off).
func TestGRPCShedWaitsForDecision(t *testing.T) {
	f := newGRPCFixture(t, 1<<20, withUnknownSize(1000), withHold(5*time.Second, 8))
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)

	errc := make(chan error, 1)
	go func() { errc <- f.export(context.Background()) }()
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 1 }, 10*time.Second, time.Millisecond)
	assert.Zero(t, f.traces.calls.Load(), "a held call's handler must not run")
	assert.Zero(t, f.payloads.in.Load(), "a held call's message is not read")
	assert.Zero(t, f.stats().Reserved, "a held call holds none of the budget")
	assert.EqualValues(t, 64<<10, f.stats().Held, "what its client may send meanwhile is counted in the held pool")

	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	require.NoError(t, <-errc)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyShed))
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.Zero(t, f.stats().HeldRequests)
	assert.Zero(t, f.stats().Held)
	assert.Equal(t, callSize(1<<20), f.stats().Peak, "admitted, it holds what its message may decode to, a quarter of the budget")
	f.requireReleased(t)
}

// TestGRPCShedWaitEnds: a shed call that no decision admits within the
// hold's max_wait is refused before its handler runs, counted once as
// shed, and holds nothing afterwards.
func TestGRPCShedWaitEnds(t *testing.T) {
	f := newGRPCFixture(t, 1<<20, withUnknownSize(1000), withHold(200*time.Millisecond, 8))
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	requireRefused(t, f.export(context.Background()), "shed", grpcRetryHigh)
	assert.Zero(t, f.traces.calls.Load())
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyShed))
	assert.EqualValues(t, 1, f.rec.total())
	assert.Zero(t, f.stats().HeldRequests)
	assert.Zero(t, f.stats().Held)
	f.requireReleased(t)
}

// TestGRPCOpenHeld: in Open a gRPC call waits for a decision that admits
// it, as a shed one does, within its deadline: some clients (the
// JavaScript SDK's gRPC exporter) retry no refusal at all, and the SDKs'
// whole export, retries included, must fit in 10 s. What its client may
// send meanwhile (its stream's flow-control window) is counted in the held
// pool while it waits; a call that finds every place of the hold taken, or
// the held pool full, is refused at the tap.
func TestGRPCOpenHeld(t *testing.T) {
	f := newGRPCFixture(t, 1<<20, withUnknownSize(1000), withHold(time.Minute, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	held := make(chan error, 1)
	go func() { held <- f.export(ctx) }()
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 1 }, 10*time.Second, time.Millisecond)
	assert.EqualValues(t, 64<<10, f.stats().Held, "its flow-control window is counted while it waits")

	f.dec.set(decision.SignalLogs, decision.VerdictDenyShed)
	requireRetryable(t, f.pushAll(ctx, 1, 10), "shed", grpcRetryHigh)
	assert.Zero(t, f.push.messages.Load(), "the only place is taken: refused at the tap")

	f.dec.set(decision.SignalTraces, decision.VerdictAdmit) // the Open ends
	require.NoError(t, <-held)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, f.stats().Held)
	f.requireReleased(t)

	// The held pool is at least as large as the budget: a call whose
	// window does not fit in what is left of it is refused at once.
	const budget = 64 << 10
	f2 := newGRPCFixture(t, budget, withUnknownSize(1000), withHold(time.Minute, 8), withHeldPool(0))
	f2.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	go func() { held <- f2.export(ctx) }()
	require.Eventually(t, func() bool { return f2.stats().Held == budget }, 10*time.Second, time.Millisecond)
	requireRetryable(t, f2.export(ctx), "open", grpcRetryHigh)
	assert.EqualValues(t, 1, f2.stats().HeldRequests)
	// The pool may be larger than the budget (the runner sizes it by the
	// memory limit): then a second call waits too.
	f2.adm.SetBudget(budget, 2*budget)
	held2 := make(chan error, 1)
	go func() { held2 <- f2.export(ctx) }()
	require.Eventually(t, func() bool { return f2.stats().Held == 2*budget }, 10*time.Second, time.Millisecond)
	f2.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	require.NoError(t, <-held)
	require.NoError(t, <-held2)
	f2.requireReleased(t)
}

// TestGRPCShedThenBudget: a held call admitted by a later decision while the
// budget is full waits for its bytes too, still holding its place, and
// runs once they are free.
func TestGRPCShedThenBudget(t *testing.T) {
	f, release := fullBudgetFixture(t, 5*time.Second)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	errc := make(chan error, 1)
	go func() { errc <- f.export(context.Background()) }()
	require.Eventually(t, func() bool { return f.stats().HeldRequests == 1 }, 10*time.Second, time.Millisecond)
	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)
	// Admitted by the decision, it now waits for the budget, still held.
	require.Never(t, func() bool { return f.traces.calls.Load() > 0 }, 200*time.Millisecond, 10*time.Millisecond)
	assert.EqualValues(t, 1, f.stats().HeldRequests)

	release()
	require.NoError(t, <-errc)
	assert.EqualValues(t, 1, f.traces.calls.Load())
	assert.Zero(t, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyShed))
	assert.Zero(t, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictAdmit))
	assert.Zero(t, f.stats().HeldRequests)
	f.requireReleased(t)
}

// TestGRPCWaitEndsBeforeDeadline: a waiting call is refused before the
// time its client gave it has passed (most of it, leaving at least a
// second), however long the hold's max_wait, so that its client gets a
// refusal rather than a deadline it gives up on while the collector takes
// the data (a duplicate once the client sends it again).
func TestGRPCWaitEndsBeforeDeadline(t *testing.T) {
	for _, shed := range []bool{true, false} {
		t.Run(map[bool]string{true: "shed", false: "budget"}[shed], func(t *testing.T) {
			f, release := fullBudgetFixture(t, 30*time.Second)
			defer release()
			if shed {
				f.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			err := f.export(ctx)
			require.Error(t, err)
			assert.NotEqual(t, codes.DeadlineExceeded, status.Code(err), "refused before the client's deadline: %v", err)
			assert.Zero(t, f.traces.calls.Load())
			assert.Zero(t, f.stats().HeldRequests)
		})
	}
}

// TestGRPCGate: a call whose wait in the hold ended in a refusal after
// its message had arrived is refused by the interceptors before its
// handler runs, unary or streaming, and its context is cancelled.
func TestGRPCGate(t *testing.T) {
	a := newAdm(t, 8<<20, withHold(50*time.Millisecond, 8))
	a.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	mw := newGRPCMiddleware(t, a)
	h := grpcStats{mw}
	ctx := context.WithValue(context.Background(), peerKey{}, netip.MustParseAddr("127.0.0.1"))
	rctx, err := mw.tap(ctx, &tap.Info{FullMethodName: traceExport})
	require.NoError(t, err, "let in to wait")
	h.HandleRPC(rctx, &stats.Begin{}) // waits out max_wait in the hold
	require.ErrorIs(t, rctx.Err(), context.Canceled)
	_, err = mw.unaryGate(rctx, nil, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) {
		t.Error("the handler ran")
		return nil, nil
	})
	requireRetryable(t, err, "shed", grpcRetryHigh)
	err = mw.streamGate(nil, gateStream{ctx: rctx}, &grpc.StreamServerInfo{}, func(any, grpc.ServerStream) error {
		t.Error("the handler ran")
		return nil
	})
	requireRetryable(t, err, "shed", grpcRetryHigh)
	h.HandleRPC(rctx, &stats.End{Error: err})
	a.requireReleased(t)
	assert.EqualValues(t, 1, a.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyShed))
	assert.EqualValues(t, 1, a.rec.total())
	assert.Zero(t, a.stats().HeldRequests)
}

// gateStream is a server stream of ctx, for the stream interceptor.
type gateStream struct {
	grpc.ServerStream
	ctx context.Context //nolint:containedctx // the stream's context
}

func (s gateStream) Context() context.Context { return s.ctx }

// TestGRPCObserveOnly: in observe-only mode every call is admitted, and
// the refusal it would have had is counted: Open, or a full budget.
func TestGRPCObserveOnly(t *testing.T) {
	const call = 64 << 10
	f := newGRPCFixture(t, call, withMaxMessage(call), withObserveOnly(), withHold(time.Minute, 8))
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	require.NoError(t, f.export(context.Background()))
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyOpen))
	f.dec.set(decision.SignalTraces, decision.VerdictAdmit)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := f.pushStream(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.stats().Reserved == call }, 10*time.Second, time.Millisecond)
	require.NoError(t, f.export(context.Background()), "the budget is full, but only counted")
	assert.EqualValues(t, 1, f.rec.get(protoGRPC, decision.SignalTraces, decision.VerdictDenyBudget))
	assert.EqualValues(t, 2, f.traces.calls.Load())
	assert.Zero(t, f.stats().HeldRequests, "nothing is held")
	cancel()
	f.requireReleased(t)
}
