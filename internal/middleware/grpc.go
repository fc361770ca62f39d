// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

// GRPC is the gRPC server middleware: a tap handle that decides when a
// call's headers arrive, before any message is read (unary and streaming
// alike), and a stats handler that readies the call when its handler
// starts (a call let in to wait waits there, its message unread beyond
// its flow-control window), charges its message once decoded and releases
// everything when the call ends.
type GRPC struct {
	settings
}

// NewGRPC returns the gRPC middleware for cfg.
func NewGRPC(cfg Config) (*GRPC, error) {
	s, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	return &GRPC{settings: s}, nil
}

// ServerOptions returns the options to install on the server: an InTapHandle,
// a StatsHandler and interceptors. grpc-go allows one tap handle per server
// (a second one panics when the server is built); stats handlers combine
// with others.
func (g *GRPC) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(g.tap),
		grpc.StatsHandler(grpcStats{g}),
		grpc.ChainUnaryInterceptor(g.unaryGate),
		grpc.ChainStreamInterceptor(g.streamGate),
	}
}

// unaryGate refuses a call whose wait ended in a refusal but whose message
// had already arrived: its handler must not run.
func (g *GRPC) unaryGate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.gate(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// streamGate is unaryGate for streaming calls.
func (g *GRPC) streamGate(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.gate(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}

func (g *GRPC) gate(ctx context.Context) error {
	if c, ok := ctx.Value(callKey{}).(*call); ok && c.refused.Load() {
		return g.rejections.get(c.refusedWith, g.retry.Draw(c.refusedWith))
	}
	return nil
}

// callKey carries a *call from the tap to the stats handler: the context
// the tap returns becomes the call's, which every HandleRPC of that call
// derives from.
type callKey struct{}

// peerKey carries the connection's remote address from TagConn to the tap:
// the context of every stream derives from the connection's.
type peerKey struct{}

// call is one admitted call.
type call struct {
	t *admission.Ticket
	// cancel ends the call (Stall); stop cancels the safety net, see tap.
	cancel context.CancelFunc
	stop   func() bool
	// refused is set when the call's wait ended in a refusal, refusedWith
	// (written before it) the verdict it ended with.
	refused     atomic.Bool
	refusedWith decision.Verdict
}

// Stall cancels the call: it has sent no message for long, or the
// receivers are stopping.
func (c *call) Stall() { c.cancel() }

// mdHeader is a call's metadata as admission.Header (keys lower-case).
type mdHeader metadata.MD

func (h mdHeader) Values(name string) []string { return h[name] }

// tap runs on the connection's reader goroutine when a call's headers
// arrive, before any authentication. It must never block: a map lookup,
// an atomic decision, CASes on the budget.
func (g *GRPC) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	sig, ok := g.cls.GRPC(info.FullMethodName)
	if !ok {
		g.unclassified(admission.ProtocolGRPC, info.FullMethodName)
		return ctx, nil
	}
	remote, _ := ctx.Value(peerKey{}).(netip.Addr)
	t, v := g.adm.Admit(ctx, admission.Request{
		Protocol: admission.ProtocolGRPC,
		Signal:   sig,
		Remote:   remote,
		Header:   mdHeader(info.Header),
		Length:   -1,
	})
	if !v.Admitted() {
		return ctx, g.rejections.get(v, g.retry.Draw(v))
	}
	if t == nil {
		return ctx, nil // nothing to follow (no budget)
	}
	c := &call{t: t}
	ctx, c.cancel = context.WithCancel(ctx)
	// Safety net: grpc-go sends *stats.End only for calls that reach a
	// registered method. A call aborted after the tap (deadline already
	// expired) or addressed to an unregistered service (profiles when the
	// receiver has no profiles pipeline) never ends in the stats handler,
	// and its bytes would be held for ever. The call's context is always
	// cancelled when it goes away, so release then; *stats.Begin (sent only
	// on the path that also sends End) stops the net so that a client's
	// cancel cannot release while the handler runs.
	c.stop = context.AfterFunc(ctx, func() { c.t.Release(false) })
	return context.WithValue(ctx, callKey{}, c), nil
}

// grpcStats is the stats.Handler half of the middleware.
type grpcStats struct{ g *GRPC }

func (grpcStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// TagConn finds the connection's remote address once, for every call of
// it.
func (grpcStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if t, ok := info.RemoteAddr.(*net.TCPAddr); ok {
		return context.WithValue(ctx, peerKey{}, t.AddrPort().Addr())
	}
	return ctx
}

func (grpcStats) HandleConn(context.Context, stats.ConnStats) {}

func (grpcStats) HandleRPC(ctx context.Context, rs stats.RPCStats) {
	if rs.IsClient() {
		return
	}
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return
	}
	switch rs := rs.(type) {
	case *stats.Begin:
		// If stop reports false the net has fired (the call was cancelled
		// before its handler started) and has released.
		if !c.stop() {
			return
		}
		// Refused, the call is cancelled before its message is read, which
		// the exporters retry (CANCELLED); if the message had already
		// arrived, the gate refuses it before the handler runs.
		if v := c.t.Start(ctx, c, rs.IsClientStream); !v.Admitted() {
			c.refusedWith = v
			c.refused.Store(true)
			c.cancel()
		}
	case *stats.InPayload:
		wire := rs.CompressedLength
		if wire == 0 {
			wire = rs.Length // not filled in by older grpc-go
		}
		c.t.Decoded(int64(rs.Length), int64(wire))
	case *stats.End:
		c.t.Release(rs.Error == nil)
		c.cancel()
	}
}
