// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// budget bounds the bytes reserved by admitted, unfinished requests, shared
// by every server of one extension, with each key's share of it (keyTable).
//
// Reservations are lock-free: CASes on the key's counter (and its
// origin's) and on the budget. Only a request that has been admitted may
// wait for bytes (an HTTP body growing past its reservation, a gRPC call
// waiting for what its message may decode to), and waits are served oldest
// first: while requests wait, new reservations leave free what the waiting
// ones need.
//
// Beside it are two pools: the oversize lane's, for the bytes of bodies
// beyond their key's share, and the held pool, for what waiting gRPC
// streams buffer.
type budget struct {
	max  atomic.Int64
	keys *keyTable
	// exemptShare is the part of the budget only exempt signals may
	// take (a quarter, when any signal is exempt): the others filling the
	// budget do not refuse them, and the exempt signals stay within what
	// the budget's size assumes.
	exemptShare float64

	reserved atomic.Int64
	// peak is the largest reserved has been (Stats.Peak).
	peak atomic.Int64
	// read counts the bytes every request read, for the lane's allowance.
	read counter

	// pending is what the waiting bodies still need; waiting counts them,
	// so that a release takes the lock only when someone waits.
	pending  atomic.Int64
	waiting  atomic.Int32
	entering atomic.Int32
	// blocking counts the entrants a new reservation does not pass: all
	// but those of useOwnDecodes.
	blocking atomic.Int32
	// headKeep is what the oldest entrant the budget (not its key's share)
	// holds back needs: reservations that do not wait in line leave it
	// free, so that a call waiting for its bytes is not passed by them
	// until its deadline.
	headKeep atomic.Int64
	mu       sync.Mutex // guards queue, entrants, rechecking and the lane's waiters
	queue    []*waiter  // bodies waiting to grow, oldest first
	entrants []*entrant // requests waiting to be admitted, oldest first
	// rechecking: a goroutine serves the waits again every recountEvery
	// while any body or entrant waits (see recheck).
	rechecking bool

	lane lanePool

	// held is what waiting gRPC streams are expected to buffer, in a pool
	// of heldMax bytes, at least max.
	held, heldMax atomic.Int64

	// closing is closed when the receivers stop: every wait ends.
	closing chan struct{}
	// onWait runs again and again while a request waits to be admitted
	// (see Controller.trimSilent). Nil: nothing.
	onWait func(at time.Duration)
}

func newBudget(maxBytes int64, keys *keyTable, exemptShare float64) *budget {
	b := &budget{keys: keys, exemptShare: exemptShare, closing: make(chan struct{})}
	b.lane.b = b
	b.setMax(maxBytes)
	return b
}

// setMax resizes the budget (and the lane's pool, of the same size), as
// the memory limit or the cores it was derived from change. Reservations
// made under the old size stay.
func (b *budget) setMax(n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.max.Store(n)
	b.lane.max.Store(n)
	b.wakeAll()
}

// release returns n bytes of key k and hands them to the waiting requests.
func (b *budget) release(n int64, k Key) {
	if n <= 0 {
		return
	}
	b.reserved.Add(-n)
	b.keys.add(k, -n)
	b.wakeAll()
}

// noteRead counts n bytes read by a request of k at at.
func (b *budget) noteRead(n int64, k Key, lane bool, at time.Duration) {
	if n <= 0 {
		return
	}
	b.read.add(n, at, readWindow)
	b.keys.noteRead(k, n, lane, at)
}

// wakeAll wakes the growing bodies and hands the freed bytes to the
// entrants and to the lane's waiters, if any wait.
func (b *budget) wakeAll() {
	if b.waiting.Load() == 0 && b.entering.Load() == 0 && b.lane.waiting.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.wakeLocked()
	b.admitEntrantsLocked()
	b.lane.wakeLocked()
	b.mu.Unlock()
}

// tryGrow adds up to need bytes to an admitted request's reservation of
// key k, what is free of them within its share, if no body is waiting
// (waiting bodies are served first), and returns how many. Lock-free.
func (b *budget) tryGrow(need int64, k Key, exempt bool, at time.Duration) int64 {
	if b.waiting.Load() > 0 {
		return 0
	}
	lim, plim := b.limitsFor(k, exempt, at)
	take := min(need, b.keys.room(k, lim, plim), b.max.Load()-b.reserved.Load()-b.keepFor(exempt))
	if take <= 0 || !b.take(take, k, b.keepFor(exempt), useOf(exempt), at) {
		return 0
	}
	return take
}

// atShare reports whether a body of k that holds own bytes holds all its
// key may have (of what is not the exempt signals' reserve, unless it is
// exempt): it can go on only in the oversize lane.
func (b *budget) atShare(own int64, k Key, exempt bool, at time.Duration) bool {
	lim, plim := b.limitsFor(k, exempt, at)
	return own >= min(lim, plim, b.max.Load()-b.keepFor(exempt))
}

// waiter is a body waiting for its reservation to grow.
type waiter struct {
	age  time.Duration // admission time: older bodies are served first
	need int64
	held int64
	// origin is the key whose share bounds the body's key's too: its
	// origin's for a nested key, its own otherwise.
	k, origin Key
	exempt    bool
	wake      chan struct{} // buffered: a wake-up between two checks is kept
}

// waitGrow adds need bytes to the reservation (held bytes) of an admitted
// request of key k, waiting at most limit for them, and returns whether it
// did and how long it waited. Waiting bodies are served oldest first; a
// body younger than a waiting one does not take the bytes it needs. When
// the oldest could not be served even if every request that is not
// waiting finished, the youngest gives up at once so that the older ones
// can finish. Within a key's share (or an origin's) a younger body may be
// served first, so there they give up only when none of the key's waiting
// bodies could be served even if everything else of the key finished:
// then nothing would give bytes back before their waits ran out, and the
// youngest body of the key holding the most gives up.
func (b *budget) waitGrow(ctx context.Context, w *waiter, need, held int64, k Key, exempt bool, limit time.Duration) (bool, time.Duration) {
	if limit <= 0 {
		return false, 0
	}
	start := now()
	w.need, w.held, w.k, w.origin, w.exempt = need, held, k, k, exempt
	if p := b.keys.parentOf(k); p != 0 {
		w.origin = p
	}
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	b.mu.Lock()
	i, _ := slices.BinarySearchFunc(b.queue, w.age, func(q *waiter, age time.Duration) int { return cmp.Compare(q.age, age) })
	b.queue = slices.Insert(b.queue, i, w)
	b.pending.Add(need)
	b.waiting.Add(1)
	b.wakeLocked() // a new older waiter changes what the others may take
	b.recheckLocked()
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
		older, all, key, origin, heaviest := b.position(w, b.keepFor(false))
		at := now()
		if b.take(need, k, older+b.keepFor(exempt), useOf(exempt), at) {
			return true, now() - start
		}
		lim, plim := b.limitOf(k, at) // an exempt body's extra is taken off its need
		if all.stuck(b.max.Load()) || key.youngest && (key.deadlocked(lim) ||
			origin.deadlocked(plim) && heaviest == k) {
			return false, now() - start
		}
		select {
		case <-w.wake:
		case <-t.C:
			return false, now() - start
		case <-ctx.Done():
			return false, now() - start
		case <-b.closing:
			return false, now() - start
		}
	}
}

// line is what a set of waiting bodies is to one of them (w).
type line struct {
	n int
	// headNeed is what the oldest needs; least the least any needs, an
	// exempt body's need less the exempt reserve its key may take beyond
	// its share.
	headNeed, least int64
	held            int64 // what they all hold
	youngest        bool  // w is the youngest of them
}

func (l *line) add(q, w *waiter, extra int64) {
	n := q.need
	if q.exempt {
		n -= extra
	}
	if l.n == 0 {
		l.headNeed, l.least = q.need, n
	}
	l.n++
	l.least = min(l.least, n)
	l.held += q.held
	l.youngest = q == w
}

// stuck reports, for a line served oldest first (the whole budget's),
// whether w, its youngest, should give up: the oldest could not be served
// within limit even if every request that is not waiting finished.
func (l line) stuck(limit int64) bool {
	return l.youngest && l.headNeed > limit-l.held
}

// deadlocked reports, for the bodies of a key or an origin, whether none of
// them could be served within limit even if every other request of it
// finished. One body alone waits: its limit has shrunk, and grows again
// when the budget is no longer contended.
func (l line) deadlocked(limit int64) bool {
	return l.n > 1 && l.least > limit-l.held
}

// position returns what the bodies older than w need, and w's line among
// all waiting bodies, among those of its key, and among those of its
// origin; extra is the exempt reserve. heaviest is the key whose waiting
// bodies of w's origin hold the most, the one with the younger bodies of
// equals: a tenant holding little does not give up for its siblings. It is
// taken from the same queue as the lines, or a body that saw its origin
// deadlocked would give up for a sibling's body that gave up meanwhile.
func (b *budget) position(w *waiter, extra int64) (older int64, all, key, origin line, heaviest Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	before := true
	for _, q := range b.queue {
		if q == w {
			before = false
		} else if before {
			older += q.need
		}
		all.add(q, w, extra)
		if q.k == w.k {
			key.add(q, w, extra)
		}
		if q.origin == w.origin {
			origin.add(q, w, extra)
		}
	}
	if origin.n == key.n {
		return older, all, key, origin, w.k // no other key of its origin waits
	}
	held := make(map[Key]int64)
	for _, q := range b.queue {
		if q.origin == w.origin {
			held[q.k] += q.held
		}
	}
	most := int64(-1)
	for _, q := range b.queue {
		if q.origin == w.origin && held[q.k] >= most {
			heaviest, most = q.k, held[q.k]
		}
	}
	return older, all, key, origin, heaviest
}

func (b *budget) wakeLocked() {
	for _, q := range b.queue {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// recheckLocked starts the goroutine that serves the waits again every
// recountEvery, unless it runs. Releases wake the waits, but what a key may
// hold also grows without one: when the budget stops being contended, or
// when a recount finds fewer keys busy. A wait that only a release woke
// would then run out its wait_timeout with room free, and its body be cut
// off.
func (b *budget) recheckLocked() {
	if b.rechecking {
		return
	}
	b.rechecking = true
	go b.recheck()
}

// recheck serves the waiting bodies and entrants again every recountEvery
// until none waits or the receivers stop.
func (b *budget) recheck() {
	t := time.NewTicker(recountEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-b.closing:
			b.mu.Lock()
			b.rechecking = false
			b.mu.Unlock()
			return
		}
		b.mu.Lock()
		if len(b.queue) == 0 && len(b.entrants) == 0 {
			b.rechecking = false
			b.mu.Unlock()
			return
		}
		b.wakeLocked()
		b.admitEntrantsLocked()
		b.mu.Unlock()
	}
}

// entrant is a request waiting to be admitted.
type entrant struct {
	n        int64
	k        Key
	u        use
	admitted chan struct{} // closed when its bytes were reserved for it
}

// waitAdmit reserves n bytes for a request of key k that may wait for them
// (a gRPC call, on its own goroutine), at most limit. Released bytes are
// handed to the waiting requests oldest first, and new reservations do not
// pass them; one whose key is at its share is passed over, so that a key
// flooding the wait holds back no other.
func (b *budget) waitAdmit(ctx context.Context, n int64, k Key, u use, limit time.Duration) bool {
	if b.lineEmpty() && b.admitNow(n, k, u, now()) {
		return true
	}
	if limit <= 0 {
		return false
	}
	b.noteShort(n, k, u, now())
	e := &entrant{n: n, k: k, u: u, admitted: make(chan struct{})}
	b.mu.Lock()
	b.entrants = append(b.entrants, e)
	b.enter(e, 1)
	b.admitEntrantsLocked() // it may fit behind no one
	b.recheckLocked()
	b.mu.Unlock()

	t := time.NewTimer(limit)
	defer t.Stop()
	// While it waits, what waits on nothing is looked for again and again
	// (onWait), so that it is found once its grace is over.
	var tick <-chan time.Time
	if b.onWait != nil {
		b.onWait(now())
		tk := time.NewTicker(recountEvery)
		defer tk.Stop()
		tick = tk.C
	}
wait:
	for {
		select {
		case <-e.admitted:
			return true
		case <-tick:
			b.onWait(now())
		case <-t.C:
			break wait
		case <-ctx.Done():
			break wait
		case <-b.closing:
			break wait
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.Index(b.entrants, e)
	if i < 0 {
		return true // admitted as its wait ended
	}
	b.entrants = slices.Delete(b.entrants, i, i+1)
	b.enter(e, -1)
	b.admitEntrantsLocked() // those behind it may fit now
	return false
}

// enter counts e in (d 1) or out of (d -1) the entrants.
func (b *budget) enter(e *entrant, d int32) {
	b.entering.Add(d)
	if e.u&useOwnDecodes == 0 {
		b.blocking.Add(d)
	}
}

// lineEmpty reports whether no entrant waits that a new reservation would
// pass: none, or only bodies waiting for their own key's decodes.
func (b *budget) lineEmpty() bool { return b.blocking.Load() == 0 }

// admitEntrantsLocked admits the waiting requests, oldest first, until one
// does not fit in the budget; one whose key is at its share is passed
// over. One pass.
func (b *budget) admitEntrantsLocked() {
	kept := b.entrants[:0]
	short := false
	var keep int64
	at := now()
	for _, e := range b.entrants {
		if !short && b.take(e.n, e.k, b.pending.Load()+b.keepFor(e.u&useExempt != 0), e.u, at) {
			b.enter(e, -1)
			close(e.admitted)
			continue
		}
		// The budget, not its key's share, is short for it: the younger
		// ones wait behind it, and requests that cannot wait leave it what
		// it needs.
		if !short && b.fitsShare(e.n, e.k, e.u, at) {
			short, keep = true, e.n
		}
		kept = append(kept, e)
	}
	clear(b.entrants[len(kept):])
	b.entrants = kept
	b.headKeep.Store(keep)
}

// fitsShare reports whether n bytes of use u fit in what k's share leaves
// it: if they do not fit in the budget, the budget is short, not the share.
func (b *budget) fitsShare(n int64, k Key, u use, at time.Duration) bool {
	lim, plim := b.limitsFor(k, u&useExempt != 0, at)
	if u&useDecode != 0 {
		return b.keys.decodeRoom(k, max(lim, n)) >= n
	}
	return b.keys.room(k, lim, plim) >= n
}

// noteShort records that n bytes of use u for k did not fit at at: the
// budget is contended only when it, not k's share, is short. A key waiting
// for its own earlier requests would otherwise shrink every key to its fair
// part, and its next waits would keep it so.
func (b *budget) noteShort(n int64, k Key, u use, at time.Duration) {
	if b.fitsShare(n, k, u, at) {
		b.keys.noteRefused(k, at)
	} else {
		b.keys.noteAtShare(k, at)
	}
}

// releaseHeld returns what reserveHeld counted.
func (b *budget) releaseHeld(n int64) {
	if n > 0 {
		b.held.Add(-n)
	}
}

// close ends every wait: the receivers are stopping.
func (b *budget) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.closing:
	default:
		close(b.closing)
	}
}

// lanePool is the oversize lane: bodies whose own reservation is their
// key's whole share read on in it, charged to a pool of the budget's size
// rather than to their key, so that a large honest batch is not refused
// for ever (a retryable refusal that can never succeed is data lost after
// the client's retries) and takes nothing from the other keys. Several
// bodies read in it side by side while the pool has room, so that a slow
// one cannot keep the others out; one body alone may read past the pool,
// bounded by the receiver's max_request_body_size, since nothing else
// could ever admit it. So may the oldest when every body in the lane waits
// for bytes: otherwise they would wait for one another until their waits
// ran out.
type lanePool struct {
	b       *budget
	max     atomic.Int64
	used    atomic.Int64
	bodies  atomic.Int32
	waiting atomic.Int32
	queue   []*waiter // guarded by b.mu
}

// enter counts a body in the lane.
func (l *lanePool) enter() { l.bodies.Add(1) }

// leave takes a body and its n bytes out of the lane.
func (l *lanePool) leave(n int64) {
	l.bodies.Add(-1)
	l.used.Add(-n)
	l.b.wakeAll()
}

// tryTake takes n bytes of the pool if they fit, or if the body is alone
// in the lane and no body waits.
func (l *lanePool) tryTake(n int64) bool {
	if l.waiting.Load() > 0 {
		return false
	}
	if l.bodies.Load() <= 1 {
		l.used.Add(n)
		return true
	}
	return casAdd(&l.used, n, l.max.Load())
}

// take waits for n bytes of the pool for w, at most limit, oldest first:
// the caller tried tryTake first, and a wait is what it checks Open after.
func (l *lanePool) take(ctx context.Context, w *waiter, n int64, limit time.Duration) (bool, time.Duration) {
	if limit <= 0 {
		return false, 0
	}
	start := now()
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	b := l.b
	b.mu.Lock()
	i, _ := slices.BinarySearchFunc(l.queue, w.age, func(q *waiter, age time.Duration) int { return cmp.Compare(q.age, age) })
	l.queue = slices.Insert(l.queue, i, w)
	l.waiting.Add(1)
	l.wakeLocked() // the first may now be the only one that can go on
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		if i := slices.Index(l.queue, w); i >= 0 {
			l.queue = slices.Delete(l.queue, i, i+1)
		}
		l.waiting.Add(-1)
		l.wakeLocked()
		b.mu.Unlock()
	}()
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		b.mu.Lock()
		first := len(l.queue) > 0 && l.queue[0] == w
		b.mu.Unlock()
		if first {
			// Alone, or every body in the lane waits: none would give bytes
			// back, so the oldest reads on past the pool.
			if in := l.bodies.Load(); in <= 1 || l.waiting.Load() >= in {
				l.used.Add(n)
				return true, now() - start
			}
			if casAdd(&l.used, n, l.max.Load()) {
				return true, now() - start
			}
		}
		select {
		case <-w.wake:
		case <-t.C:
			return false, now() - start
		case <-ctx.Done():
			return false, now() - start
		case <-b.closing:
			return false, now() - start
		}
	}
}

func (l *lanePool) wakeLocked() {
	if len(l.queue) > 0 {
		select {
		case l.queue[0].wake <- struct{}{}:
		default:
		}
	}
}
