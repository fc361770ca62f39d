// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/otelthrottle/throttle/internal/decision"
)

// GRPC is the gRPC server middleware: a tap handle that decides when a
// stream's headers arrive, before any message is read (unary and streaming
// alike), and a stats handler that learns each connection's peer, grows a
// reservation to the size of the message once it has arrived, learns the
// message sizes of accepted calls and releases the budget when the RPC
// ends. Build one GRPC per server: the size estimates are per server.
type GRPC struct {
	settings
	// estimate learns, per peer and signal, the largest recent message
	// size of an accepted call, and wire the largest recent size as
	// received (compressed).
	estimate peerSizes
	wire     peerSizes
}

// maxOvercommit bounds how far below a message's decoded size its RPC's
// first reservation may be (see sizeEstimate).
const maxOvercommit = 4

// minEstimate is the least an RPC reserves, so that an estimate learnt
// from empty messages still counts every call, and what a call that has
// sent no message within the idle timeout keeps.
const minEstimate = 4 << 10

// silentFactor: a call that has sent no message within this many idle
// timeouts is cancelled. Before that it keeps only minEstimate reserved
// after the first: a large message on a slow link is not cancelled on
// every retry, and a silent stream holds next to nothing.
const silentFactor = 6

// deadlineShare is the part of the time a client gave a call (its
// deadline) that the call may wait in the hold or for bytes, and
// deadlineMargin the least it leaves for the call to be handled after:
// admitted later, its answer could come after the client gave up and sent
// it again (a duplicate).
const (
	deadlineShare  = 0.8
	deadlineMargin = time.Second
)

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
		grpc.ChainUnaryInterceptor(g.unaryGate),
		grpc.ChainStreamInterceptor(g.streamGate),
	}
}

// unaryGate refuses an RPC whose wait (see await) ended in a refusal but
// whose message had already arrived: its handler must not run.
func (g *GRPC) unaryGate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := g.gate(ctx); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// streamGate is unaryGate for streaming RPCs.
func (g *GRPC) streamGate(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := g.gate(ss.Context()); err != nil {
		return err
	}
	return handler(srv, ss)
}

func (g *GRPC) gate(ctx context.Context) error {
	if r, ok := ctx.Value(reservationKey{}).(*reservation); ok {
		if r.refused.Load() {
			return g.rejections.get(r.refusedWith, g.retry.Draw(r.refusedWith))
		}
	}
	return nil
}

// reservationKey carries a *reservation from the tap to the stats handler:
// the context the tap returns becomes the stream's context, which TagRPC
// and every HandleRPC of that RPC derive from.
type reservationKey struct{}

// peerKey carries the connection's peer slot from TagConn to the tap: the
// context of every stream derives from the connection's.
type peerKey struct{}

// reservation is the budget held by one admitted RPC. It is released once,
// by whichever comes first of *stats.End and the safety net.
type reservation struct {
	b    *Budget
	sig  decision.Signal
	peer peer
	// stop cancels the safety net; see tap.
	stop func() bool
	// cancel ends the stream; the idle timer calls it for a stream that
	// has sent nothing for silentFactor idle timeouts.
	cancel context.CancelFunc
	msg    atomic.Bool
	// refused is set when a wait ended in a refusal, refusedWith (written
	// before it) the verdict it ended with.
	refused     atomic.Bool
	refusedWith decision.Verdict
	// held is the verdict the tap refused a stream with that waits for a
	// later decision instead (see await); Admit otherwise. Set by the tap,
	// read-only afterwards.
	held decision.Verdict

	// age is when the tap admitted the stream: waits are served oldest
	// first.
	age time.Duration

	mu   sync.Mutex
	n    int64
	done bool
	// idle fires IdleTimeout after the stream started (or its wait
	// ended) without a message: the reservation shrinks to minEstimate;
	// firing again later (silent), it cancels the stream.
	idle   *time.Timer
	silent bool
	// want is what a stream admitted without its bytes (the budget was
	// full) waits for when its handler starts; 0 otherwise. slot is the
	// hold place a waiting stream holds, heldBytes what it counts in the
	// budget's held pool meanwhile.
	want      int64
	slot      *Hold
	heldBytes int64
	// size and wire are the largest message of the call, decoded and as
	// received: learnt when the call ends accepted.
	size, wire int64
	// inflight counts the call while it is admitted and not finished.
	inflight *Inflight
	counted  bool
}

// admitted counts the call in flight; its release uncounts it.
func (r *reservation) admitted(c *Inflight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done && !r.counted {
		r.inflight, r.counted = c, true
		c.add(1)
	}
}

func (r *reservation) release() {
	r.mu.Lock()
	n := r.n
	first := !r.done
	r.done = true
	r.endWaitLocked()
	if r.counted {
		r.counted = false
		r.inflight.add(-1)
	}
	r.mu.Unlock()
	if first {
		r.b.release(n, r.peer)
	}
}

// endWaitLocked gives back the hold place and the held bytes of a stream
// whose wait is over.
func (r *reservation) endWaitLocked() {
	if r.slot != nil {
		r.slot.freeSlot(r.peer)
		r.slot = nil
	}
	r.b.releaseHeld(r.heldBytes)
	r.heldBytes = 0
}

// grow charges the reservation up to size, the size of a message that has
// arrived, so that the budget shows what is being handled.
func (r *reservation) grow(size int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || size <= r.n {
		return
	}
	r.b.charge(size-r.n, r.peer)
	r.n = size
}

// startIdle starts the idle timer of a stream that is going to read its
// message.
func (r *reservation) startIdle(idle time.Duration) {
	if idle <= 0 {
		return
	}
	r.mu.Lock() // expire takes it: it must see r.idle set
	r.idle = time.AfterFunc(idle, func() { r.expire(idle) })
	r.mu.Unlock()
}

// expire runs when a stream has sent no message within the idle timeout:
// the first time its reservation shrinks to minEstimate (its message, when
// it comes, is charged as it arrives), the next time, silentFactor-1 idle
// timeouts later, the stream is cancelled.
func (r *reservation) expire(idle time.Duration) {
	if r.msg.Load() {
		return
	}
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	if r.silent {
		r.mu.Unlock()
		r.cancel()
		return
	}
	r.silent = true
	excess := r.n - minEstimate
	if excess > 0 {
		r.n = minEstimate
	}
	r.idle.Reset((silentFactor - 1) * idle)
	r.mu.Unlock()
	if excess > 0 {
		r.b.release(excess, r.peer)
	}
}

// stopIdle stops the idle timer, if any.
func (r *reservation) stopIdle() {
	r.mu.Lock()
	if r.idle != nil {
		r.idle.Stop()
	}
	r.mu.Unlock()
}

// tap runs on the connection's reader goroutine when a stream's headers
// arrive, before any authentication. It must never block: a map lookup, an
// atomic decision, CASes on the budget.
func (g *GRPC) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	sig, ok := g.cls.GRPC(info.FullMethodName)
	if !ok {
		g.unclassified(ProtocolGRPC, info.FullMethodName)
		return ctx, nil
	}
	p, _ := ctx.Value(peerKey{}).(peer)
	t := now()
	g.peers.touch(p, t)
	var r *reservation
	if v := g.dec.Decide(sig); !v.Admitted() {
		if g.observe {
			g.rec.Record(ProtocolGRPC, sig, v)
			return ctx, nil
		}
		// A refused stream waits for a later decision when its handler
		// starts (see await), as a held HTTP request does, rather than
		// being refused here: a refused exporter backs off for seconds
		// whatever RetryInfo says, and some retry no refusal at all. It
		// waits with a hold place and its expected message counted in
		// the held pool, since grpc-go buffers the message meanwhile.
		if r = g.holdAtTap(sig, p, t, g.sizeEstimate(sig, p)); r == nil {
			return ctx, g.reject(sig, v)
		}
		r.held = v
	} else if g.budget == nil {
		g.rec.Record(ProtocolGRPC, sig, decision.VerdictAdmit)
		return ctx, nil
	} else if n := g.sizeEstimate(sig, p); g.budget.admit(n, p) || g.dec.Exempt(sig) && g.budget.admitExempt(n, p) {
		// An exempt signal is bounded by the budget as the others are,
		// with an overdraft the others cannot take (admitExempt).
		g.rec.Record(ProtocolGRPC, sig, decision.VerdictAdmit)
		r = &reservation{b: g.budget, n: n, sig: sig, peer: p, age: t, cancel: func() {}}
		r.admitted(g.inflight)
	} else {
		if g.observe {
			g.rec.Record(ProtocolGRPC, sig, decision.VerdictDenyBudget)
			return ctx, nil
		}
		// The stream waits for its bytes when its handler starts (see
		// await), for the same reason. One that cannot wait in line is
		// not held back by it (a peer whose streams fill the hold must
		// not lock the others out): admitted if it fits now.
		if g.budget.wait > 0 {
			r = g.holdAtTap(sig, p, t, n)
		}
		switch {
		case r != nil:
			r.want = n
		case g.budget.admitNow(n, p):
			g.rec.Record(ProtocolGRPC, sig, decision.VerdictAdmit)
			r = &reservation{b: g.budget, n: n, sig: sig, peer: p, age: t, cancel: func() {}}
			r.admitted(g.inflight)
		default:
			return ctx, g.reject(sig, decision.VerdictDenyBudget)
		}
	}
	waits := r.slot != nil
	if g.idle > 0 || waits {
		ctx, r.cancel = context.WithCancel(ctx)
	}
	// A waiting stream starts its idle timer once its wait is over.
	if !waits {
		r.startIdle(g.idle)
	}
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

// holdAtTap takes a hold place for a stream of peer p and counts n bytes
// of it in the budget's held pool; nil when either is full (p at its share
// of the places included).
func (g *GRPC) holdAtTap(sig decision.Signal, p peer, t time.Duration, n int64) *reservation {
	if !g.hold.takeSlot(p) {
		return nil
	}
	if !g.budget.reserveHeld(n) {
		g.hold.freeSlot(p)
		return nil
	}
	return &reservation{b: g.budget, slot: g.hold, heldBytes: n, sig: sig, peer: p, age: t, cancel: func() {}}
}

// await runs when the handler of a stream that the tap let in to wait
// starts (*stats.Begin, on the stream's goroutine: the connection's other
// streams go on), its message unread beyond the stream's flow-control
// window. A refused stream waits in the hold for a decision that admits
// it, as a held HTTP request does, then for its bytes; a stream admitted
// without its bytes (the budget was full) waits for them, oldest first, for
// as long as it may wait (waitLeft). Refused, the stream is
// cancelled before its message is read, which the exporters retry
// (CANCELLED); if the message had already arrived, the gate refuses it
// before the handler runs (RESOURCE_EXHAUSTED with RetryInfo, as at the
// tap).
func (g *GRPC) await(ctx context.Context, r *reservation) {
	v := decision.VerdictAdmit
	r.mu.Lock()
	want := r.want
	r.mu.Unlock()
	if r.held != decision.VerdictAdmit {
		limit := g.waitLeft(ctx, r.age)
		hctx, cancel := context.WithTimeout(ctx, max(limit, 0))
		v = g.hold.hold(hctx, r.sig, r.held, limit)
		cancel()
		if v.Admitted() && g.budget != nil {
			if n := g.sizeEstimate(r.sig, r.peer); g.budget.admit(n, r.peer) {
				r.mu.Lock()
				r.n = n
				r.mu.Unlock()
			} else {
				want = n
			}
		}
	}
	ok := true
	if want > 0 {
		// As long as it may wait at all (most of its deadline): a stream
		// refused for bytes is lost to a client that retries no refusal.
		ok = g.budget.waitAdmit(ctx, want, r.peer, g.waitLeft(ctx, r.age))
		if !ok {
			v = decision.VerdictDenyBudget
			g.peers.refused(now())
		}
	}
	r.mu.Lock()
	r.want = 0
	r.endWaitLocked()
	late := want > 0 && ok && r.done
	if want > 0 && ok && !late {
		r.n = want
	}
	r.mu.Unlock()
	if late {
		g.budget.release(want, r.peer)
	}
	g.rec.Record(ProtocolGRPC, r.sig, v)
	if !v.Admitted() {
		r.refusedWith = v
		r.refused.Store(true)
		r.cancel()
		return
	}
	r.admitted(g.inflight)
	r.startIdle(g.idle)
}

// waitLeft is how much longer a stream that arrived at arrival may wait.
// With a deadline, deadlineShare of the time its client gave it, leaving
// at least deadlineMargin: a stream admitted later could be answered after
// its client gave up and sent it again (a duplicate), and a client whose
// whole export must fit in its deadline (the SDKs' 10 s) is served best by
// a long wait, some of them retrying no refusal at all. Without one, the
// hold's max_wait.
func (g *GRPC) waitLeft(ctx context.Context, arrival time.Duration) time.Duration {
	waited := now() - arrival
	dl, ok := ctx.Deadline()
	if !ok {
		return g.hold.maxWaitOr(0) - waited
	}
	total := time.Until(dl) + waited
	allowed := min(time.Duration(float64(total)*deadlineShare), total-deadlineMargin)
	return allowed - waited
}

func (g *GRPC) reject(sig decision.Signal, v decision.Verdict) error {
	g.rec.Record(ProtocolGRPC, sig, v)
	if v == decision.VerdictDenyBudget {
		g.peers.refused(now())
	}
	return g.rejections.get(v, g.retry.Draw(v))
}

// sizeEstimate is what an RPC of sig from peer p reserves: the largest
// message of an accepted call of that peer and signal received on this
// server in the last 10 to 20 seconds as it came on the wire (compressed),
// but at least a quarter of the largest decoded one (unknownSize when
// there was none), at least minEstimate; never more than the peer's share,
// as an HTTP body larger than that starts with it: a reservation that can
// never be made would lock a signal out.
//
// Wire size, as an HTTP body starts with its Content-Length: reserving the
// decoded size up front admits a fifth as many of the usual gzip-compressed
// exports, too few to keep the collector busy (design §7); the floor keeps
// messages that decompress far more than usual from multiplying what the
// budget admits by more than maxOvercommit. Per peer, and learnt only from
// calls that ended accepted (after any authenticator): one peer's large or
// amplifying messages raise only its own reservations. A maximum rather
// than an average: small or empty messages cannot lower it while large
// ones arrive. The reservation then grows to the decoded size when the
// message has arrived (see reservation.grow), so that the budget shows a
// large message while it is handled and refuses others. A stream holds one
// reservation, of its largest message, for its whole life (its messages
// are handled one at a time).
func (g *GRPC) sizeEstimate(sig decision.Signal, p peer) int64 {
	t := now()
	n := g.estimate.get(p, sig, t)
	if n == 0 {
		n = g.unknownSize
	} else if w := g.wire.get(p, sig, t); w > 0 {
		n = max(min(w, n), n/maxOvercommit)
	}
	n = max(n, min(minEstimate, g.unknownSize))
	if g.budget == nil {
		return n
	}
	return min(n, g.budget.maxFor(p))
}

// grpcStats is the stats.Handler half of the middleware.
type grpcStats struct{ g *GRPC }

func (grpcStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// TagConn finds the connection's peer slot once, for every stream of it.
func (h grpcStats) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if p := h.g.peers.ofNet(info.RemoteAddr); p != 0 {
		return context.WithValue(ctx, peerKey{}, p)
	}
	return ctx
}

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
			if r.stop() && r.slot != nil {
				h.g.await(ctx, r)
			}
		}
	case *stats.InPayload:
		if r, ok := ctx.Value(reservationKey{}).(*reservation); ok {
			if r.msg.CompareAndSwap(false, true) {
				r.stopIdle()
			}
			r.grow(int64(rs.Length))
			wire := rs.CompressedLength
			if wire == 0 {
				wire = rs.Length // not filled in by older grpc-go
			}
			r.mu.Lock()
			r.size, r.wire = max(r.size, int64(rs.Length)), max(r.wire, int64(wire))
			r.mu.Unlock()
		}
	case *stats.End:
		if r, ok := ctx.Value(reservationKey{}).(*reservation); ok {
			// Learnt before the release, so that whoever sees the bytes
			// back also sees what the call taught.
			if rs.Error == nil && r.msg.Load() {
				t := now()
				r.mu.Lock()
				size, wire := r.size, r.wire
				r.mu.Unlock()
				h.g.estimate.observe(r.peer, r.sig, size, t)
				h.g.wire.observe(r.peer, r.sig, wire, t)
			}
			r.release()
			r.stopIdle()
			r.cancel()
		}
	}
}
