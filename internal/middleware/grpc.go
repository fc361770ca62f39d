package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/otelthrottle/throttle/internal/decision"
)

// GRPC is the gRPC server middleware: a tap handle that decides when a
// stream's headers arrive, before any message is read (unary and streaming
// alike), and a stats handler that releases the budget when the RPC ends
// and learns the message sizes. Build one GRPC per server: the size
// estimate is per server.
type GRPC struct {
	settings
	// estimate is the running average of received message sizes per
	// signal, 0 until the first message has been seen.
	estimate [decision.NumSignals]atomic.Int64
}

// NewGRPC returns the gRPC middleware for cfg.
func NewGRPC(cfg Config) (*GRPC, error) {
	s, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	return &GRPC{settings: s}, nil
}

// ServerOptions returns the options to install on the server: an InTapHandle
// and a StatsHandler. grpc-go allows one tap handle per server (a second one
// panics when the server is built); stats handlers combine with others.
func (g *GRPC) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(g.tap),
		grpc.StatsHandler(grpcStats{g}),
	}
}

// reservationKey carries a *reservation from the tap to the stats handler:
// the context the tap returns becomes the stream's context, which TagRPC
// and every HandleRPC of that RPC derive from.
type reservationKey struct{}

// reservation is the budget held by one admitted RPC. It is released once,
// by whichever comes first of *stats.End and the safety net.
type reservation struct {
	b    *Budget
	n    int64
	sig  decision.Signal
	done atomic.Bool
	// stop cancels the safety net; see tap.
	stop func() bool
}

func (r *reservation) release() {
	if r.done.CompareAndSwap(false, true) {
		r.b.Release(r.n)
	}
}

// tap runs on the connection's reader goroutine when a stream's headers
// arrive. It must never block: a map lookup, an atomic decision, a CAS on
// the budget.
func (g *GRPC) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	sig, ok := g.cls.GRPC(info.FullMethodName)
	if !ok {
		return ctx, nil
	}
	if g.dec.Exempt(sig) {
		g.rec.Record(ProtocolGRPC, sig, decision.Admit)
		return ctx, nil
	}
	if v := g.dec.Decide(sig); !v.Admitted() {
		return ctx, g.reject(sig, v)
	}
	if g.budget == nil {
		g.rec.Record(ProtocolGRPC, sig, decision.Admit)
		return ctx, nil
	}
	n := g.sizeEstimate(sig)
	if !g.budget.Reserve(n) {
		return ctx, g.reject(sig, decision.DenyBudget)
	}
	g.rec.Record(ProtocolGRPC, sig, decision.Admit)
	r := &reservation{b: g.budget, n: n, sig: sig}
	// Safety net: grpc-go sends *stats.End only for RPCs that reach a
	// registered method. A stream aborted after the tap (deadline already
	// expired) or addressed to an unregistered service (e.g. profiles when
	// the receiver has no profiles pipeline) never ends in the stats
	// handler, and its reservation would leak for ever. The stream's
	// context is always cancelled when the stream goes away, so release
	// then; *stats.Begin (sent only on the path that also sends End) stops
	// the net so a client cancel cannot release while the handler runs.
	r.stop = context.AfterFunc(ctx, r.release)
	return context.WithValue(ctx, reservationKey{}, r), nil
}

func (g *GRPC) reject(sig decision.Signal, v decision.Verdict) error {
	g.rec.Record(ProtocolGRPC, sig, v)
	return g.rejections.get(v, g.retry.Draw(v))
}

// sizeEstimate is what an RPC of sig reserves: the running average of the
// messages received on this server, or unknownSize before any; never more
// than the whole budget, as an HTTP body larger than it reserves the whole
// budget: a reservation that can never be made would lock a signal out.
//
// The reservation is not settled to the actual size: the message has been
// read and decoded by the time its size is known, so growing then protects
// nothing; the actual size feeds the estimate for the next RPCs instead.
// A stream reserves one estimate for its whole life (its messages are
// handled one at a time).
func (g *GRPC) sizeEstimate(sig decision.Signal) int64 {
	n := g.estimate[sig].Load()
	if n == 0 {
		n = g.unknownSize
	}
	return min(n, g.budget.Max())
}

// observe feeds one received message size (uncompressed, as it is decoded;
// the same unit an HTTP request is charged once confighttp decompresses it)
// into the running average: an EWMA with weight 1/8. A lost CAS race drops
// one sample, which an average can afford; the tap never waits on it.
func (g *GRPC) observe(sig decision.Signal, size int) {
	e := &g.estimate[sig]
	old := e.Load()
	next := int64(size)
	if old != 0 {
		next = old + (next-old)/8
	}
	// 0 means "no data"; an empty message still counts as data.
	next = max(next, 1)
	e.CompareAndSwap(old, next)
}

// grpcStats is the stats.Handler half of the middleware.
type grpcStats struct{ g *GRPC }

func (grpcStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (grpcStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (grpcStats) HandleConn(context.Context, stats.ConnStats) {}

func (h grpcStats) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	if rs.IsClient() {
		return
	}
	switch rs := rs.(type) {
	case *stats.Begin:
		if r, ok := ctx.Value(reservationKey{}).(*reservation); ok {
			// If stop reports false the net has fired (the stream was
			// cancelled before the handler started) and has released.
			r.stop()
		}
	case *stats.InPayload:
		if r, ok := ctx.Value(reservationKey{}).(*reservation); ok {
			h.g.observe(r.sig, rs.Length)
		}
	case *stats.End:
		if r, ok := ctx.Value(reservationKey{}).(*reservation); ok {
			r.release()
		}
	}
}
