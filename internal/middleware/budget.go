// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBudgetWait bounds how long a body that has outgrown its
// reservation waits, in total, for bytes to be released (admission.wait_timeout
// default). It is the retry delay of a budget rejection: a body that has
// already been read and decompressed in part should wait about as long as a
// refused client would before its retry, rather than fail and be sent again.
const DefaultBudgetWait = BudgetRetryDelay

// BudgetConfig configures a Budget.
type BudgetConfig struct {
	// Max is the size of the budget in bytes; <= 0 means no budget.
	Max int64
	// PeerShare is the share of Max that the admissions of one peer (remote
	// IP address; an IPv6 address counts by its /64) may hold while it is
	// the only one sending; with more peers active each gets a fair share
	// (see Peers). Outside (0, 1) there is no per-peer limit. Ignored when
	// Peers is set.
	PeerShare float64
	// Peers is the peer table shared with the hold; nil: the budget makes
	// its own from PeerShare.
	Peers *Peers
	// Wait bounds how long, in total, an admitted body that has outgrown
	// its reservation waits for bytes to be released; 0 fails it at once.
	Wait time.Duration
}

// Budget bounds the bytes reserved by admitted, unfinished requests. It is
// shared by every server of one extension. A nil *Budget is valid and
// unlimited: every reservation succeeds and Reserved is 0, which is how
// max_inflight_bytes: 0 disables it.
//
// Admission is lock-free: one CAS on the peer's counter and one on the
// budget. Only a body that has been admitted and outgrows its reservation
// may wait (growth), and waits are served oldest body first: while bodies
// wait, admissions leave free what the waiting bodies still need.
//
// No peer holds more than its share (Peers), growth included. A body whose
// own reservation has reached its peer's share goes on in the oversize lane
// (see acquireLane): one such body at a time, its bytes beyond the share not
// counted against the others, so that no body, however large or slow, takes
// the budget from the other peers. Streams that wait for a decision or for
// bytes (gRPC) reserve their expected message in a second pool of the same
// size, heldBytes, since grpc-go buffers their message while they wait.
type Budget struct {
	// max changes when the memory limit or the cores do (SetMax).
	max   atomic.Int64
	peers *Peers
	wait  time.Duration
	// highWater is set by tests only (WatchHighWater); nil, it costs a
	// reservation one load of a line it reads anyway.
	highWater atomic.Pointer[HighWater]

	reserved atomic.Int64
	// held is what waiting gRPC streams expect to buffer (reserveHeld), in
	// a pool of heldMax bytes, at least max.
	held    atomic.Int64
	heldMax atomic.Int64
	// lane is the oversize lane's token (a buffered channel of one: the
	// waiters for it are served in order); laneBytes counts what its body
	// read beyond its peer's share.
	lane      chan struct{}
	laneBytes atomic.Int64
	// read counts the bytes requests read (released reservations and lane
	// bytes), for the lane's allowance (Peers.laneAllowance).
	read readCounter

	// pending is what the waiting bodies still need; waiting counts them,
	// so that a release takes the lock only when someone waits.
	pending atomic.Int64
	waiting atomic.Int32
	mu      sync.Mutex // guards queue and entrants
	queue   []*waiter  // oldest first
	// entrants are requests waiting to be admitted (waitAdmit), oldest
	// first; entering counts them, so that a release takes the lock only
	// when someone waits.
	entrants []*entrant
	entering atomic.Int32
	// headKeep is what the oldest entrant the budget (not its peer's
	// share) holds back needs: requests that do not wait in line (HTTP)
	// leave it free, so that a stream waiting for its bytes is not passed
	// by them until its deadline (a stream refused for bytes is a lost
	// batch to a client that retries nothing).
	headKeep atomic.Int64
}

// NewBudget returns a budget of maxBytes with the default wait and no
// per-peer limit; maxBytes <= 0 returns nil (no budget).
func NewBudget(maxBytes int64) *Budget {
	return NewBudgetWith(BudgetConfig{Max: maxBytes, Wait: DefaultBudgetWait})
}

// NewBudgetWith returns a budget for cfg, or nil when cfg.Max <= 0.
func NewBudgetWith(cfg BudgetConfig) *Budget {
	if cfg.Max <= 0 {
		return nil
	}
	b := &Budget{wait: max(cfg.Wait, 0), peers: cfg.Peers, lane: make(chan struct{}, 1)}
	if b.peers == nil {
		b.peers = NewPeers(cfg.PeerShare)
	}
	b.SetMax(cfg.Max)
	return b
}

// SetMax resizes the budget to maxBytes (> 0; others are ignored), as the
// memory limit or the cores it was derived from change. Reservations made
// under the old size stay; a smaller budget admits nothing new until enough
// of them are released.
func (b *Budget) SetMax(maxBytes int64) {
	if b == nil || maxBytes <= 0 {
		return
	}
	b.max.Store(maxBytes)
	b.wakeAll()
}

// Peers is the budget's peer table.
func (b *Budget) Peers() *Peers {
	if b == nil {
		return nil
	}
	return b.peers
}

func (b *Budget) peerOfRemote(remoteAddr string) peer { return b.Peers().ofRemote(remoteAddr) }

// maxFor is the largest first reservation a request of peer p can make: a
// request larger than that starts with it and grows as it is read.
func (b *Budget) maxFor(p peer) int64 {
	m := b.max.Load()
	if p == 0 {
		return m
	}
	return b.peers.limit(m)
}

// growFor is the most peer p may hold by growing its bodies now (see
// Peers.growLimit).
func (b *Budget) growFor(p peer) int64 {
	m := b.max.Load()
	if p == 0 {
		return m
	}
	return b.peers.growLimit(m, now())
}

// Reserve takes n bytes from the budget if they fit, leaving free what
// waiting bodies need, and reports whether they did. It never blocks.
// n <= 0 always fits and reserves nothing.
func (b *Budget) Reserve(n int64) bool { return b.admit(n, 0) }

// Release returns n bytes taken by a successful Reserve(n).
func (b *Budget) Release(n int64) { b.release(n, 0) }

// admit reserves n bytes for a new request of peer p if they fit in p's
// share and in what is left of the budget once the waiting bodies have what
// they need, and no request waits to be admitted (waitAdmit: a new request
// does not pass those in line). Lock-free; n <= 0 always fits.
func (b *Budget) admit(n int64, p peer) bool {
	if b == nil || n <= 0 {
		return true
	}
	if b.entering.Load() > 0 {
		return false
	}
	return b.admitNow(n, p)
}

// admitNow is admit regardless of the requests waiting to be admitted.
func (b *Budget) admitNow(n int64, p peer) bool {
	return b.takeFor(n, p, b.pending.Load()+b.headKeep.Load(), b.maxFor(p))
}

// admitExempt reserves n bytes for a new request of an exempt signal of
// peer p if they fit in twice p's share and twice the budget, ahead of the
// requests waiting in line: the other signals, which cannot take the
// budget over, filling it do not refuse an exempt one, and the exempt
// signals' bytes stay bounded by a second budget's worth. Only its
// admission overdraws: a body that grows past its reservation grows as the
// others do.
func (b *Budget) admitExempt(n int64, p peer) bool {
	if b == nil || n <= 0 {
		return true
	}
	lim := b.maxFor(p)
	return b.takeFor(n, p, -b.max.Load(), 2*lim)
}

// takeFor reserves n bytes for peer p if they fit in lim, the most p may
// hold, and in the budget with keep bytes left free.
func (b *Budget) takeFor(n int64, p peer, keep, lim int64) bool {
	if !b.peers.reserve(p, n, lim) {
		return false
	}
	if !b.take(n, keep) {
		b.peers.add(p, -n)
		return false
	}
	return true
}

// take reserves n bytes if they fit in the budget with keep bytes left
// free; a negative keep lets them take the budget over by as much.
func (b *Budget) take(n, keep int64) bool {
	for {
		cur := b.reserved.Load()
		// Written as a subtraction so a huge n cannot overflow.
		if n > b.max.Load()-cur-keep {
			return false
		}
		next := cur + n
		if b.reserved.CompareAndSwap(cur, next) {
			b.noteReserved(next)
			return true
		}
	}
}

// noteReserved tells the high-water mark, if any, of a new reserved total.
func (b *Budget) noteReserved(v int64) {
	if h := b.highWater.Load(); h != nil {
		h.note(v)
	}
}

// charge adds n bytes that are already in memory (a gRPC message larger
// than its estimate, once received): they are counted even beyond the
// budget, so that the budget shows them and refuses others meanwhile.
func (b *Budget) charge(n int64, p peer) {
	if b == nil || n <= 0 {
		return
	}
	b.noteReserved(b.reserved.Add(n))
	b.peers.add(p, n)
}

// release returns n bytes of peer p and wakes the waiting bodies.
func (b *Budget) release(n int64, p peer) {
	if b == nil || n <= 0 {
		return
	}
	b.reserved.Add(-n)
	b.peers.add(p, -n)
	t := now()
	b.read.add(n, t)
	b.peers.noteRead(p, n, t)
	b.wakeAll()
}

// wakeAll wakes the growing bodies and hands the freed bytes to the
// entrants, if any wait.
func (b *Budget) wakeAll() {
	if b.waiting.Load() == 0 && b.entering.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.wakeLocked()
	b.admitEntrantsLocked()
	b.mu.Unlock()
}

// tryGrow adds up to need bytes to an admitted request's reservation,
// what is free of them within its peer's share, if no body is waiting
// (waiting bodies are served first), and returns how many. Lock-free.
func (b *Budget) tryGrow(need int64, p peer) int64 {
	if b.waiting.Load() > 0 {
		return 0
	}
	lim := b.growFor(p)
	take := min(need, b.peers.room(p, lim), b.max.Load()-b.reserved.Load())
	if take <= 0 || !b.takeFor(take, p, 0, lim) {
		return 0
	}
	return take
}

// atShare reports whether a body of peer p that holds own bytes holds all
// its peer may grow to: it can grow only in the oversize lane.
func (b *Budget) atShare(own int64, p peer) bool {
	return own >= b.growFor(p)
}

// waiter is a body waiting for its reservation to grow.
type waiter struct {
	age  time.Duration // admission time: older bodies are served first
	need int64
	held int64
	wake chan struct{} // buffered: a wake-up between two checks is kept
}

// waitGrow adds need bytes to the reservation (held bytes) of an admitted
// request of peer p, waiting at most limit for them. Waiting bodies are
// served oldest first; a body younger than a waiting one does not take the
// bytes it needs. When the oldest waiting body could not be served even if
// every request that is not waiting finished, the waiting bodies hold what
// it needs, and the youngest of them gives up at once (returns false) so
// that the older ones can finish. It returns whether the bytes were taken
// and how long it waited. need must fit in p's share beside held (see
// atShare): a body waits for its peer's other requests, never for bytes
// its peer may not have.
func (b *Budget) waitGrow(ctx context.Context, w *waiter, need, held int64, p peer, limit time.Duration) (bool, time.Duration) {
	if limit <= 0 {
		return false, 0
	}
	start := now()
	w.need, w.held = need, held
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	b.mu.Lock()
	i, _ := slices.BinarySearchFunc(b.queue, w.age, func(q *waiter, age time.Duration) int { return cmp.Compare(q.age, age) })
	b.queue = slices.Insert(b.queue, i, w)
	b.pending.Add(need)
	b.waiting.Add(1)
	b.wakeLocked() // a new older waiter changes what the others may take
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		if i := slices.Index(b.queue, w); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.pending.Add(-need)
		b.waiting.Add(-1)
		b.wakeLocked()
		b.admitEntrantsLocked() // what it needed is no longer kept free
		b.mu.Unlock()
	}()

	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		older, headNeed, waitHeld, youngest := b.position(w)
		if b.takeFor(need, p, older, b.growFor(p)) {
			return true, now() - start
		}
		if youngest && headNeed > b.max.Load()-waitHeld {
			return false, now() - start
		}
		select {
		case <-w.wake:
		case <-t.C:
			return false, now() - start
		case <-ctx.Done():
			return false, now() - start
		}
	}
}

// position returns what the bodies older than w need, what the oldest
// waiting body needs, what all waiting bodies hold, and whether w is the
// youngest.
func (b *Budget) position(w *waiter) (older, headNeed, waitHeld int64, youngest bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	before := true
	for _, q := range b.queue {
		if q == w {
			before = false
		} else if before {
			older += q.need
		}
		waitHeld += q.held
	}
	if len(b.queue) > 0 {
		headNeed = b.queue[0].need
		youngest = b.queue[len(b.queue)-1] == w
	}
	return older, headNeed, waitHeld, youngest
}

func (b *Budget) wakeLocked() {
	for _, q := range b.queue {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// acquireLane takes the oversize lane for a body of peer p whose own
// reservation has reached its peer's share, waiting at most limit, in
// order, while another body has it; at once false when pressed (the
// collector is under pressure, Decider.Pressed) while p has lately read
// its allowance in the lane (see laneWindow). In the lane a body reads on
// without further charge, bounded by the receiver's max_request_body_size:
// refusing it would be a retryable error that could never succeed, so its
// client would retry until it drops the data. Its bytes beyond the share
// are not counted against the other peers, so it takes nothing from them;
// one body at a time bounds what the lane adds to memory, and the minimum
// rate of an HTTP body (IdleTimeout) bounds how long a slow one keeps it.
func (b *Budget) acquireLane(ctx context.Context, p peer, pressed bool, limit time.Duration) bool {
	if pressed && b.laneIndebted(p, now()) {
		return false
	}
	select {
	case b.lane <- struct{}{}:
		return true
	default:
	}
	if limit <= 0 {
		return false
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case b.lane <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// releaseLane gives the lane's token back; its body of peer p read n
// bytes there, counted for p's allowance (Peers.laneAllowed).
func (b *Budget) releaseLane(p peer, n int64) {
	t := now()
	if n > 0 {
		b.read.add(n, t)
		b.peers.noteRead(p, n, t)
		b.peers.laneRead(p, n, t)
	}
	<-b.lane
}

// laneIndebted reports whether peer p has lately read its allowance in the
// oversize lane (Peers.laneAllowance): under pressure its requests that may
// need the lane (of unknown or more than its share's length) are refused at
// once rather than decompressed up to its share first.
func (b *Budget) laneIndebted(p peer, t time.Duration) bool {
	if b == nil {
		return false
	}
	others := b.read.recent(t) - b.peers.readRecent(p, t)
	return !b.peers.laneAllowed(p, b.peers.laneAllowance(b.max.Load(), others), t)
}

// SetHeldMax sizes the pool of what waiting gRPC streams may buffer;
// never below the budget's size.
func (b *Budget) SetHeldMax(n int64) {
	if b != nil {
		b.heldMax.Store(n)
	}
}

// reserveHeld counts n bytes a waiting gRPC stream may buffer, if they fit
// in the held pool (SetHeldMax, at least the budget's size).
func (b *Budget) reserveHeld(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	pool := max(b.heldMax.Load(), b.max.Load())
	for {
		cur := b.held.Load()
		if n > pool-cur {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// releaseHeld returns what reserveHeld counted.
func (b *Budget) releaseHeld(n int64) {
	if b != nil && n > 0 {
		b.held.Add(-n)
	}
}

// entrant is a request waiting to be admitted.
type entrant struct {
	n        int64
	p        peer
	admitted chan struct{} // closed when its bytes were reserved for it
}

// waitAdmit admits a request of n bytes from peer p as admit does, waiting
// at most limit for the bytes when they do not fit. Released bytes are
// handed to the waiting requests oldest first (no herd of woken waiters),
// and new requests do not pass them; one whose peer is at its share is
// passed over, so that a peer flooding the wait cannot hold the others
// back. Bodies growing past their reservation (waitGrow) come first:
// admissions leave what they need free.
func (b *Budget) waitAdmit(ctx context.Context, n int64, p peer, limit time.Duration) bool {
	if b.admit(n, p) {
		return true
	}
	if limit <= 0 {
		return false
	}
	// Someone waits for bytes: the budget is contended, and bodies grow
	// only within their fair shares until it is over.
	b.peers.refused(now())
	e := &entrant{n: n, p: p, admitted: make(chan struct{})}
	b.mu.Lock()
	b.entrants = append(b.entrants, e)
	b.entering.Add(1)
	b.admitEntrantsLocked() // it may fit behind no one
	b.mu.Unlock()

	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-e.admitted:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.Index(b.entrants, e)
	if i < 0 {
		return true // admitted as its wait ended
	}
	b.entrants = slices.Delete(b.entrants, i, i+1)
	b.entering.Add(-1)
	b.admitEntrantsLocked() // those behind it may fit now
	return false
}

// admitEntrantsLocked admits the waiting requests, oldest first, until one
// does not fit in the budget; one whose peer is at its share is passed
// over. One pass.
func (b *Budget) admitEntrantsLocked() {
	kept := b.entrants[:0]
	short := false
	var keep int64
	for _, e := range b.entrants {
		if !short && b.takeFor(e.n, e.p, b.pending.Load(), b.maxFor(e.p)) {
			b.entering.Add(-1)
			close(e.admitted)
			continue
		}
		// The budget, not its peer's share, is short for it: the younger
		// ones wait behind it, and requests that cannot wait leave it
		// what it needs.
		if !short && b.peers.room(e.p, b.maxFor(e.p)) >= e.n {
			short, keep = true, e.n
		}
		kept = append(kept, e)
	}
	clear(b.entrants[len(kept):])
	b.entrants = kept
	b.headKeep.Store(keep)
}

// Reserved returns the bytes currently reserved (the inflight_bytes gauge):
// the budget's reservations, gRPC messages larger than their estimate
// (which can take it over Max while they are handled) and the oversize
// lane's body beyond its peer's share.
func (b *Budget) Reserved() int64 {
	if b == nil {
		return 0
	}
	return b.reserved.Load() + b.laneBytes.Load()
}

// Held returns the bytes waiting gRPC streams are expected to buffer.
func (b *Budget) Held() int64 {
	if b == nil {
		return 0
	}
	return b.held.Load()
}

// Max returns the size of the budget; 0 for a nil (unlimited) budget.
func (b *Budget) Max() int64 {
	if b == nil {
		return 0
	}
	return b.max.Load()
}

// HighWater is the largest value a Budget's Reserved has reached since
// WatchHighWater, for tests: production budgets keep no mark.
type HighWater struct{ v atomic.Int64 }

// Load returns the mark.
func (h *HighWater) Load() int64 { return h.v.Load() }

func (h *HighWater) note(v int64) {
	for {
		cur := h.v.Load()
		if v <= cur || h.v.CompareAndSwap(cur, v) {
			return
		}
	}
}

// WatchHighWater starts a high-water mark of b's reservations at what is
// reserved now, and returns it. Call it before the reservations it should
// see; for tests.
// A nil budget's mark stays 0.
func (b *Budget) WatchHighWater() *HighWater {
	h := &HighWater{}
	if b != nil {
		h.note(b.reserved.Load())
		b.highWater.Store(h)
	}
	return h
}
