// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// readStep is the most an HTTP body's reservation grows by at once, and the
// most of it that may be ahead of what has been received once the body's
// head start (the idle timeout) is over: a client that trickles its body
// holds about what it has sent, not what it has announced.
const readStep = 64 << 10

// heldWindow is grpc-go's initial flow-control window of a stream: what a
// waiting call's client can send before the collector reads anything, the
// least a waiting call counts in the held pool.
const heldWindow = 64 << 10

// silentFactor: a gRPC call that has sent no message within this many idle
// timeouts is cancelled: a large message on a slow link is not cancelled
// on every retry, and a silent call holds its reservation only so long.
const silentFactor = 6

// deadlineShare is the part of the time a client gave a gRPC call (its
// deadline) that the call may wait in the hold or for bytes, and
// deadlineMargin the least it leaves for the call to be handled after:
// admitted later, its answer could come after the client gave up and sent
// it again (a duplicate).
const (
	deadlineShare  = 0.8
	deadlineMargin = time.Second
)

// Ticket is one request's way through the admission: filled by
// Controller.Admit, released once by Release. Its methods are safe to call
// from the request's goroutine and the controller's timers; Read is not
// called concurrently with itself.
type Ticket struct {
	c *Controller
	// ctx is the request's: a wait ends when its client goes away.
	ctx     context.Context //nolint:containedctx // the request's own, for the waits of its body's reads
	key     Key
	sig     decision.Signal
	proto   Protocol
	exempt  bool
	age     time.Duration // admission time: waits are served oldest first
	known   int64         // the body's length; -1 when unknown
	onStall Staller

	// Read's own state.
	waitLeft time.Duration
	w        waiter
	probe    [1]byte

	// mu guards what Release, the timers and Close share with the request's
	// goroutine; it is never held while reading or waiting.
	mu           sync.Mutex
	reserved     int64 // bytes held in the budget
	lane         int64 // bytes held in the oversize lane's pool
	inLane       bool
	laneSince    time.Duration
	read         int64 // bytes read (HTTP) or decoded (gRPC, all its messages)
	lastProgress time.Duration
	progressAt   int64 // read when lastProgress was last moved
	late         bool  // older than the idle timeout: no more head start
	inRead       bool
	eof          bool
	done         bool
	killed       bool
	counted      bool // counted in flight
	// unrecorded: an HTTP body's decision is recorded once its first
	// bytes are reserved (admitted) or refused (budget), or when it ends
	// without reading any.
	unrecorded bool
	// allowed: the request was let in (counted allowed, or would_deny
	// with observe_only), not refused at its first reservation or in
	// Start; cut: it was counted cut off.
	allowed bool
	cut     bool
	idle    *time.Timer

	// weighed is what the fair drops counted the request as: what it was
	// expected to cost when it arrived, then what it read, if more.
	weighed int64

	// A gRPC call that waits in Start: the tap's refusal it waits out
	// (VerdictAdmit: it waits for bytes only); its hold place and held-pool
	// bytes.
	pend      bool
	held      decision.Verdict
	place     bool
	heldBytes int64
	streaming bool
	// decoding is what the call holds as still to be decoded (its key's
	// undecoded calls' part), until its message is decoded.
	decoding int64
	msg      bool
	size     int64 // the largest message, decoded
	wire     int64 // the largest message, on the wire

	prev, next *Ticket // in the controller's set of unfinished tickets
	listed     bool
}

// refuse records a refusal and returns it; the ticket is done.
func (t *Ticket) refuse(v decision.Verdict) decision.Verdict {
	t.mu.Lock()
	t.unrecorded, t.allowed = false, false
	t.mu.Unlock()
	t.Release(false)
	return t.c.refuse(t.key, Request{Protocol: t.proto, Signal: t.sig}, now(), v)
}

// Start readies an admitted request to be handled, with s to cut it off
// (nil: never): an HTTP body that stops sending, or a gRPC call that sends
// no message, and every unfinished request when the receivers stop. A
// gRPC call runs it when its handler starts, on its own goroutine and
// before its message is read: a call the tap let in to wait for a decision
// waits here in the hold, then every call reserves what its message may
// decode to (see callSize), waiting for it, oldest first, for most of its
// deadline. It returns VerdictAdmit, or the refusal the call must end with.
// streaming: the client sends more than one message; the call then keeps
// what a message may decode to for its whole life.
func (t *Ticket) Start(ctx context.Context, s Staller, streaming bool) decision.Verdict {
	t.mu.Lock()
	t.onStall, t.streaming = s, streaming
	t.mu.Unlock()
	if t.c.closed.Load() {
		// Admitted after Close listed the unfinished requests (another
		// receiver's server still serves): cut off after the grace too.
		t.shutdown(t.c.shutdownGrace)
	}
	if t.proto == ProtocolGRPC {
		if v := t.startCall(ctx); !v.Admitted() {
			return v
		}
	}
	t.startIdle()
	return decision.VerdictAdmit
}

// startCall is Start's wait of a gRPC call.
func (t *Ticket) startCall(ctx context.Context) decision.Verdict {
	c := t.c
	t.mu.Lock()
	pend, held := t.pend, t.held
	t.mu.Unlock()
	v := decision.VerdictAdmit
	if pend && held != decision.VerdictAdmit {
		v = c.hold.wait(ctx, t.key, t.sig, held, t.callWaitLeft(ctx))
	}
	if v.Admitted() && c.budget != nil {
		v = t.reserveDecode(ctx)
	}
	t.mu.Lock()
	t.pend = false
	t.endWaitLocked()
	t.mu.Unlock()
	if !v.Admitted() {
		v = t.refuse(v)
		return v
	}
	if pend {
		t.mu.Lock()
		t.age = now()
		t.mu.Unlock()
		t.admitted(decision.VerdictAdmit)
	}
	t.record(decision.VerdictAdmit)
	return decision.VerdictAdmit
}

// reserveDecode makes a gRPC call hold what its message may decode to
// (callSize) before the message is read: it gives back its estimate and
// reserves that, at once if it fits, else waiting for it, oldest first,
// for most of the call's deadline. Giving the estimate back first keeps two
// calls of one key from each holding part of what the other waits for. A
// call whose signal turned Open while it waited is refused: what it would
// leave in the pipeline is what the memory line is there to stop. It
// returns VerdictAdmit or the refusal.
func (t *Ticket) reserveDecode(ctx context.Context) decision.Verdict {
	c, b := t.c, t.c.budget
	at := now()
	n := c.callSize()
	decodeOf := n // what counts as the key's undecoded calls'
	t.mu.Lock()
	had := t.reserved
	t.reserved = 0
	t.mu.Unlock()
	lim, plim := b.limitOf(t.key, at)
	ok, waited := true, false
	switch {
	case had >= n && b.keys.claimDecode(t.key, n, max(lim, n), max(plim, n)):
		// Its estimate covers it, and it keeps it: only what its key's
		// undecoded calls hold has to fit.
		n = had
	case c.observe:
		b.release(had, t.key)
		b.charge(n, t.key)
		b.keys.addDecoding(t.key, n)
	default:
		b.release(had, t.key)
		switch {
		case b.lineEmpty() && b.admitNow(n, t.key, useOf(t.exempt)|useDecode, at):
		case c.cfg.WaitTimeout > 0 && t.countWait(at):
			ok, waited = b.waitAdmit(ctx, n, t.key, useOf(t.exempt)|useDecode, t.callWaitLeft(ctx)), true
		default:
			ok = false
			b.noteShort(n, t.key, useOf(t.exempt)|useDecode, at)
		}
	}
	if !ok {
		return decision.VerdictDenyBudget
	}
	v := decision.VerdictAdmit
	if waited {
		if open, _ := c.dec.Pressure(t.sig); open {
			v = decision.VerdictDenyOpen
		}
	}
	t.mu.Lock()
	if t.done {
		v = decision.VerdictDenyBudget // released meanwhile
	}
	streaming := t.streaming
	if v.Admitted() {
		t.reserved, t.decoding = n, decodeOf
	}
	t.mu.Unlock()
	if v.Admitted() && streaming {
		b.keys.addStreaming(t.key, decodeOf)
	}
	if !v.Admitted() {
		b.keys.endDecode(t.key, decodeOf)
		b.release(n, t.key)
	}
	return v
}

// countWait counts a gRPC call about to wait for what its message may
// decode to as the calls waiting for a decision are: a place in the hold
// and, in the held pool, what its client may send meanwhile (grpc-go
// buffers it; the budget holds nothing for the call while it waits). False
// when either is full: the call is refused at once, so that a key's calls
// that the tap let in cannot wait, buffering, in any number. A call let in
// to wait has its place already.
func (t *Ticket) countWait(at time.Duration) bool {
	c := t.c
	t.mu.Lock()
	counted := t.place || t.heldBytes > 0
	t.mu.Unlock()
	if counted {
		return true
	}
	var n int64
	if c.hold != nil {
		var ok bool
		if n, ok = c.takeHeld(t.key, t.sig, at); !ok {
			return false
		}
	} else if n = max(heldWindow, c.keys.sizeOf(t.key, t.sig, at, true)); !c.budget.reserveHeld(n) {
		return false
	}
	t.mu.Lock()
	t.place, t.heldBytes = c.hold != nil, n
	t.mu.Unlock()
	return true
}

// callWaitLeft is how much longer a gRPC call may wait: deadlineShare of the
// time its client gave it, leaving at least deadlineMargin, at most
// maxCallWait; without a deadline, the hold's max_wait.
func (t *Ticket) callWaitLeft(ctx context.Context) time.Duration {
	waited := now() - t.age
	dl, ok := ctx.Deadline()
	if !ok {
		return t.c.hold.maxWaitOr(0) - waited
	}
	total := time.Until(dl) + waited
	allowed := min(time.Duration(float64(total)*deadlineShare), total-deadlineMargin, maxCallWait)
	return allowed - waited
}

// endWaitLocked gives back the hold place and the held bytes of a call
// whose wait is over.
func (t *Ticket) endWaitLocked() {
	if t.place {
		t.c.hold.freePlace(t.key)
		t.place = false
	}
	if t.heldBytes > 0 {
		t.c.budget.releaseHeld(t.heldBytes)
		t.heldBytes = 0
	}
}

// Decoded charges a gRPC call the size of a message it has received and
// decoded, and wire its size as received (compressed): a call with one
// message holds its size while it is handled, instead of what it might
// have decoded to; a streaming call keeps the larger of both.
func (t *Ticket) Decoded(size, wire int64) {
	c := t.c
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.msg {
		t.msg = true
		if t.idle != nil {
			t.idle.Stop()
		}
	}
	t.size, t.wire = max(t.size, size), max(t.wire, wire)
	t.read += size
	if over := t.weighLocked(); over > 0 {
		c.keys.arrived(t.key, t.sig, over, now())
	}
	if t.done || c.budget == nil {
		return
	}
	// What a call decodes counts as read, like a body's bytes: the lane's
	// allowance is a share of what the other keys read.
	c.budget.noteRead(size, t.key, false, now())
	if t.decoding > 0 && !t.streaming {
		// Decoded: the key's next call need not wait for the pipeline to
		// be done with this one.
		c.keys.endDecode(t.key, t.decoding)
		t.decoding = 0
	}
	switch {
	case size > t.reserved:
		c.budget.charge(size-t.reserved, t.key)
		t.reserved = size
	case !t.streaming && size < t.reserved:
		c.budget.release(t.reserved-size, t.key)
		t.reserved = size
	}
}

// Release gives back everything the request holds, once; later reads fail
// and later calls do nothing. accepted: the receiver answered with a
// success, so that the sizes it read teach what the next requests of its
// key and signal reserve (a body that failed to decode, or that an
// authenticator refused, must not raise them).
func (t *Ticket) Release(accepted bool) {
	c := t.c
	if c == nil {
		return
	}
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return
	}
	t.done = true
	n, lane, inLane := t.reserved, t.lane, t.inLane
	t.reserved, t.lane, t.inLane = 0, 0, false
	if t.idle != nil {
		t.idle.Stop()
	}
	t.endWaitLocked()
	counted, unrecorded := t.counted, t.unrecorded
	t.counted, t.unrecorded = false, false
	decoding, streaming := t.decoding, t.streaming
	t.decoding = 0
	learn := accepted && (t.eof || t.msg)
	size, wire := t.read, int64(0)
	if t.proto == ProtocolGRPC {
		size, wire = t.size, t.wire
	}
	t.mu.Unlock()
	if learn {
		at := now()
		c.keys.learn(t.key, t.sig, size, at, false)
		if wire > 0 {
			c.keys.learn(t.key, t.sig, wire, at, true)
		}
	}
	if c.budget != nil {
		if decoding > 0 {
			c.keys.endDecode(t.key, decoding)
			if streaming {
				c.keys.addStreaming(t.key, -decoding)
			}
		}
		c.budget.release(n, t.key)
		if inLane {
			c.budget.lane.leave(lane)
		}
	}
	if counted {
		c.inflight.Add(-1)
	}
	if unrecorded {
		c.rec.Record(t.proto, t.sig, decision.VerdictAdmit)
		c.keys.noteDecision(t.key, true, t.age)
	}
	c.keys.addLive(t.key, -1)
	c.tickets.remove(t)
}

// Read reads the HTTP body r into p, reserving bytes in the budget before
// it reads them: a body is charged what it reads, decompressed, as it reads
// it. The first byte is read before anything is reserved, so that a
// request that sends nothing holds nothing. A read that would pass the
// reservation first takes more, 64 KiB at a time, waiting (oldest first,
// at most wait_timeout in all) while the budget is full; a body whose own
// reservation is its key's whole share reads on in the oversize lane. It
// fails with ErrBudget when no bytes come in time, and with ErrIdle once
// its client has stopped sending (see startIdle).
func (t *Ticket) Read(r io.Reader, p []byte) (int, error) {
	if len(p) == 0 {
		return r.Read(p)
	}
	c := t.c
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return 0, errReadAfterRelease
	}
	if t.killed {
		// Cut off: what net/http has buffered of the body is not read
		// either, or its first bytes could still be refused and the
		// request counted denied after being counted cut off.
		t.mu.Unlock()
		return 0, ErrIdle
	}
	at := now()
	if c.cfg.IdleTimeout > 0 {
		t.trimLocked(at)
	}
	avail := t.reserved + t.lane - t.read
	inLane, laneSince := t.inLane, t.laneSince
	t.mu.Unlock()
	if c.budget == nil {
		return t.rawRead(r, p, at)
	}
	if inLane && c.laneTenure > 0 && at-laneSince > c.laneTenure && !c.observe {
		t.cutOff(CutBudget)
		return 0, ErrBudget
	}
	if avail > 0 {
		if int64(len(p)) > avail {
			p = p[:avail]
		}
		return t.rawRead(r, p, at)
	}
	// Tell the end of the body from more of it first, so that a body that
	// sends nothing, or ends exactly at its reservation, takes nothing.
	n, err := t.rawRead(r, t.probe[:], at)
	if n == 0 {
		return 0, err
	}
	if err != nil {
		// The body ended with this byte: nothing to wait for.
		t.chargeProbe(1)
	} else if gerr := t.grow(len(p)); gerr != nil {
		t.mu.Lock()
		t.read-- // the probed byte is not handed on
		t.mu.Unlock()
		switch {
		case !errors.Is(gerr, ErrBudget) && !errors.Is(gerr, ErrOpen):
		case t.ctx.Err() != nil: // its client went away: told nothing
		case c.closed.Load():
			t.cutOff(CutStopping) // Close ended its wait
		case errors.Is(gerr, ErrBudget):
			t.cutOff(CutBudget)
		default:
			t.cutOff(CutOpen)
		}
		return 0, gerr
	}
	p[0] = t.probe[0]
	return 1, err
}

var errReadAfterRelease = errors.New("throttle: body read after its request ended")

// grow makes room for the next bytes of a body, want of them at most, of
// which the probed byte is the first.
func (t *Ticket) grow(want int) error {
	c, b := t.c, t.c.budget
	t.mu.Lock()
	reserved, inLane, read := t.reserved, t.inLane, t.read
	need := min(int64(want), readStep)
	if t.known >= 0 {
		need = min(need, t.known-read+1)
	}
	need = max(need, 1)
	t.mu.Unlock()
	at := now()
	switch {
	case reserved == 0 && !inLane:
		// The first bytes: what bodies of this key and signal lately turned
		// out to be (unknown_size before any), or the known length if
		// smaller, within the key's share. A key with room in its share
		// waits for the budget, oldest first, at most wait_timeout (the
		// others hold more than their share and will let go of it); one
		// without is refused at once.
		n := c.keys.sizeOf(t.key, t.sig, at, false)
		if n == 0 {
			n = c.unknownSize
		}
		if t.known >= 0 {
			n = min(n, t.known)
		}
		lim, plim := b.limitsFor(t.key, t.exempt, at)
		// Within its key's room and what is not the exempt signals'
		// reserve (unless it is exempt): what could never be had is not
		// asked for.
		free := b.max.Load() - b.keepFor(t.exempt)
		room := min(b.keys.room(t.key, lim, plim), free)
		// A key whose share its own unary gRPC calls hold for messages
		// still to be decoded waits for what they give back when decoded,
		// holding a place in the hold as those calls do when they wait, so
		// that what waits so is bounded per key.
		forDecodes := false
		if room == 0 && c.waitsForDecodes() {
			if soon := min(b.keys.bodyRoom(t.key, lim, plim), free); soon > 0 && t.waitLeft > 0 && t.countWait(at) {
				room, forDecodes = soon, true
			}
		}
		n = max(min(n, room), min(need, max(room, 1)))
		if !b.admitNow(n, t.key, useOf(t.exempt), at) {
			if c.observe {
				t.record(decision.VerdictDenyBudget)
				b.charge(n, t.key)
			} else {
				ok := false
				switch {
				case room >= n && t.waitLeft > 0:
					// In line with the gRPC calls waiting to start: like them,
					// it holds nothing yet.
					u := useOf(t.exempt)
					if forDecodes {
						u |= useOwnDecodes
					}
					ok = b.waitAdmit(t.ctx, n, t.key, u, t.waitLeft)
					t.waitLeft -= now() - at
					if forDecodes {
						t.mu.Lock()
						t.endWaitLocked()
						t.mu.Unlock()
					}
					if ok && t.openedWhileWaiting(n, false) {
						t.record(decision.VerdictDenyOpen)
						return ErrOpen
					}
				case room >= n:
					c.keys.noteRefused(t.key, at) // no wait: the budget is short
				default:
					c.keys.noteAtShare(t.key, at)
				}
				if !ok {
					t.record(decision.VerdictDenyBudget)
					return ErrBudget
				}
			}
		}
		if forDecodes { // admitted without waiting
			t.mu.Lock()
			t.endWaitLocked()
			t.mu.Unlock()
		}
		t.record(decision.VerdictAdmit)
		return t.add(n, false)
	case inLane:
		return t.growLane(need)
	case b.atShare(reserved, t.key, t.exempt, at):
		// Its own reservation is its key's whole share: the lane.
		if !t.enterLane(at) {
			c.keys.noteAtShare(t.key, at)
			return ErrBudget
		}
		return t.growLane(need)
	}
	lim, plim := b.limitsFor(t.key, t.exempt, at)
	need = min(need, max(min(lim, plim)-reserved, 1))
	if got := b.tryGrow(need, t.key, t.exempt, at); got > 0 {
		return t.add(got, false)
	}
	if c.observe {
		b.charge(need, t.key)
		return t.add(need, false)
	}
	b.noteShort(need, t.key, useOf(t.exempt), at)
	ok, waited := b.waitGrow(t.ctx, &t.w, need, reserved, t.key, t.exempt, t.waitLeft)
	t.waitLeft -= waited
	if !ok {
		return ErrBudget
	}
	if t.openedWhileWaiting(need, false) {
		return ErrOpen
	}
	return t.add(need, false)
}

// openedWhileWaiting gives back the n bytes a body's wait for the budget
// (or the lane's pool) got when its signal turned Open meanwhile, as a gRPC
// call waiting to decode does: what the body would go on to decode is what
// the memory line is there to stop.
func (t *Ticket) openedWhileWaiting(n int64, lane bool) bool {
	if open, _ := t.c.dec.Pressure(t.sig); !open {
		return false
	}
	b := t.c.budget
	if lane {
		b.lane.used.Add(-n)
		b.wakeAll()
	} else {
		b.release(n, t.key)
	}
	return true
}

// record counts the decision of an HTTP body at its first reservation,
// once.
func (t *Ticket) record(v decision.Verdict) {
	t.mu.Lock()
	first := t.unrecorded
	t.unrecorded = false
	if first && !v.Admitted() && !t.c.observe {
		t.allowed = false // refused; with observe_only let in all the same
	}
	t.mu.Unlock()
	if first {
		t.c.rec.Record(t.proto, t.sig, v)
		t.c.keys.noteDecision(t.key, v.Admitted(), t.age)
	}
}

// cutOff counts the request as cut off for r, once, unless it was counted
// refused (a body its first reservation refused is no cut-off): it was
// counted admitted, and its client is told to retry.
func (t *Ticket) cutOff(r CutReason) {
	t.mu.Lock()
	count := t.allowed && !t.cut
	t.cut = t.cut || count
	t.mu.Unlock()
	if count {
		t.c.rec.CutOff(t.proto, t.sig, r)
	}
}

// enterLane moves the body into the oversize lane, unless its key owes the
// lane while the collector is under pressure. What it holds of the budget
// stays there (its key's share); what it reads beyond goes to the lane's
// pool.
func (t *Ticket) enterLane(at time.Duration) bool {
	c := t.c
	if !c.observe && c.dec.Pressed(t.sig) && c.budget.laneIndebted(t.key, at) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return false
	}
	t.inLane, t.laneSince = true, at
	c.budget.lane.enter()
	return true
}

// growLane takes need more bytes of the lane's pool.
func (t *Ticket) growLane(need int64) error {
	c := t.c
	l := &c.budget.lane
	if c.observe {
		l.used.Add(need)
		return t.add(need, true)
	}
	if l.tryTake(need) {
		return t.add(need, true)
	}
	ok, waited := l.take(t.ctx, &t.w, need, t.waitLeft)
	t.waitLeft -= waited
	if !ok {
		return ErrBudget
	}
	if t.openedWhileWaiting(need, true) {
		return ErrOpen
	}
	return t.add(need, true)
}

// add records n bytes taken from the budget (or the lane's pool); after
// Release they go back at once.
func (t *Ticket) add(n int64, lane bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		if lane {
			t.c.budget.lane.used.Add(-n)
		} else {
			t.c.budget.release(n, t.key)
		}
		return errReadAfterRelease
	}
	if lane {
		t.lane += n
	} else {
		t.reserved += n
	}
	return nil
}

// chargeProbe counts the last byte of a body beyond its reservation.
func (t *Ticket) chargeProbe(n int64) {
	t.record(decision.VerdictAdmit)
	t.c.budget.charge(n, t.key)
	t.mu.Lock()
	done := t.done
	if !done {
		t.reserved += n
	}
	t.mu.Unlock()
	if done {
		t.c.budget.release(n, t.key)
	}
}

// trimLocked ends the head start of a body older than the idle timeout:
// what it holds more than readStep ahead of what it has received goes back.
func (t *Ticket) trimLocked(at time.Duration) {
	if at-t.age < t.c.cfg.IdleTimeout {
		return
	}
	t.late = true
	if excess := t.reserved + t.lane - (t.read + readStep); excess > 0 {
		fromLane := min(excess, t.lane)
		t.lane -= fromLane
		t.c.budget.lane.used.Add(-fromLane)
		if rest := excess - fromLane; rest > 0 {
			t.reserved -= rest
			t.c.budget.release(rest, t.key)
		} else {
			t.c.budget.wakeAll()
		}
	}
}

// rawRead reads from the body and records what was read and the progress:
// at least readStep more since the last progress, or the end of the body.
// at is when the read began; the progress is timed when it ends.
func (t *Ticket) rawRead(r io.Reader, p []byte, at time.Duration) (int, error) {
	t.mu.Lock()
	t.inRead = true
	t.mu.Unlock()
	n, err := r.Read(p)
	t.mu.Lock()
	t.inRead = false
	t.read += int64(n)
	over := t.weighLocked()
	if t.read-t.progressAt >= readStep || err == io.EOF {
		t.lastProgress, t.progressAt = now(), t.read
	}
	if err == io.EOF {
		t.eof = true
	}
	killed, inLane := t.killed, t.inLane
	t.mu.Unlock()
	if n > 0 && t.c.budget != nil {
		t.c.budget.noteRead(int64(n), t.key, inLane, at)
	}
	if over > 0 {
		t.c.keys.arrived(t.key, t.sig, over, at)
	}
	if err != nil && killed && !errors.Is(err, io.EOF) {
		err = ErrIdle
	}
	return n, err
}

// weighLocked returns what the request has read beyond what the fair
// drops counted it as, and counts it: a key that taught a small size, then
// sends large bodies that are never learnt (they fail to decode), is
// weighed by what it sends.
func (t *Ticket) weighLocked() int64 {
	over := t.read - t.weighed
	if over <= 0 {
		return 0
	}
	t.weighed = t.read
	return over
}

// startIdle times an admitted request's progress: an HTTP body that has
// not received readStep more within the idle timeout while its handler
// waits in a read is cut off (Request.OnStall), and a gRPC call that has
// sent no message within silentFactor idle timeouts is cancelled.
func (t *Ticket) startIdle() {
	idle := t.c.cfg.IdleTimeout
	t.mu.Lock() // the timer's func takes it: it must see t.idle set
	defer t.mu.Unlock()
	if idle <= 0 || t.onStall == nil || t.c.observe || t.done {
		return
	}
	if t.proto == ProtocolGRPC {
		idle *= silentFactor
	} else {
		idle -= now() - t.age // the head start runs from the admission
	}
	t.idle = time.AfterFunc(max(idle, 0), t.idleCheck)
}

// idleCheck runs when a request's idle timer fires.
func (t *Ticket) idleCheck() {
	idle := t.c.cfg.IdleTimeout
	t.mu.Lock()
	if t.done || t.eof || t.killed || t.msg {
		t.mu.Unlock()
		return
	}
	if t.proto != ProtocolGRPC {
		quiet := now() - t.lastProgress
		switch {
		case quiet < idle:
			t.idle.Reset(idle - quiet)
			t.mu.Unlock()
			return
		case !t.inRead:
			// The handler is not reading: the stall is not the client's.
			t.idle.Reset(idle)
			t.mu.Unlock()
			return
		}
	}
	t.killed = true
	t.mu.Unlock()
	t.cutOff(CutSlow)
	t.onStall.Stall()
}

// shutdown cuts the request off after grace if it is still unfinished and
// not being handled: an HTTP body still being received, a gRPC call whose
// message has not arrived.
func (t *Ticket) shutdown(grace time.Duration) {
	time.AfterFunc(grace, func() {
		t.mu.Lock()
		cut := !t.done && !t.eof && !t.msg && !t.killed && t.onStall != nil
		if cut {
			t.killed = true
		}
		t.mu.Unlock()
		if cut {
			t.cutOff(CutStopping)
			t.onStall.Stall()
		}
	})
}
