// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

// This file is the way of a request in, in the order it meets it: its key,
// the decision for it (the key's fair drop under pressure), the hold, the
// budget and its key's share of it, and its ticket. Everything off that way
// (the shares' and the fair drops' counts, the waits for bytes, the lane,
// the hold's dispatcher, a ticket's reads) is in the file of its concern.

import (
	"context"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// Admit decides a request and returns its ticket when it is admitted. An
// HTTP request the decision refuses waits in the hold, its body unread,
// until a decision admits it or it has waited max_wait; a gRPC call
// (decided on the connection's reader goroutine, which must not block) is
// let in to wait in Ticket.Start instead. It returns the ticket and
// VerdictAdmit, or nil and the denial to answer with; in observe-only mode
// every request is admitted and the denial it would have had is counted.
// An admitted request with nothing to follow (no budget, or an HTTP request
// without a body) has no ticket: nil and VerdictAdmit. Deciding, refusing
// and admitting such a request allocate nothing.
func (c *Controller) Admit(ctx context.Context, req Request) (*Ticket, decision.Verdict) {
	at := now()
	k := c.key(req)
	off := c.offered(k, req, at)
	c.keys.touch(k, req.Signal, off, at, c.dec)
	v := c.decide(k, req.Signal)
	if !v.Admitted() {
		switch {
		case c.observe:
			return c.newTicket(ctx, k, req, at, off).admitted(v)
		case !c.dec.Holdable(req.Signal):
			// A pressure that has outlasted what the hold can bridge: the
			// refusal is answered at once. Waits for budget bytes are not
			// refusals, and still wait.
			return nil, c.refuse(k, req, at, v)
		case req.Protocol == ProtocolGRPC:
			// Waits in Ticket.Start, with a place in the hold and what its
			// client sends meanwhile counted in the held pool.
			if n, ok := c.takeHeld(k, req.Signal, at); ok {
				return c.newTicket(ctx, k, req, at, off).pending(v, n)
			}
			return nil, c.refuse(k, req, at, v)
		case !c.hold.takePlace(k):
			return nil, c.refuse(k, req, at, v)
		}
		v = c.hold.wait(ctx, k, req.Signal, v, c.hold.maxWait)
		c.hold.freePlace(k)
		if !v.Admitted() {
			return nil, c.refuse(k, req, at, v)
		}
	}
	if c.budget == nil || req.Protocol == ProtocolHTTP && req.Length == 0 {
		// Nothing to follow: no bytes to charge (the hold is over).
		c.rec.Record(req.Protocol, req.Signal, decision.VerdictAdmit)
		c.keys.noteDecision(k, true, at)
		return nil, decision.VerdictAdmit
	}
	exempt := c.dec.Exempt(req.Signal)
	if req.Protocol == ProtocolGRPC {
		return c.admitCall(ctx, k, req, at, exempt, off)
	}
	// A key at its share (what its unary gRPC calls hold for messages
	// still to be decoded aside: its body may wait for that), or one that
	// owes the oversize lane under pressure, is refused what it could not
	// have, before it is read.
	lim, plim := c.budget.limitOf(k, at)
	if !exempt && c.roomForBody(k, lim, plim) <= 0 ||
		(req.Length < 0 || req.Length > lim) && c.budget.laneIndebted(k, at) && c.dec.Pressed(req.Signal) {
		c.keys.noteAtShare(k, at)
		if c.observe {
			return c.newTicket(ctx, k, req, at, off).admitted(decision.VerdictDenyBudget)
		}
		return nil, c.refuse(k, req, at, decision.VerdictDenyBudget)
	}
	return c.newTicket(ctx, k, req, at, off).admitted(decision.VerdictAdmit)
}

// key is the fairness key of req.
func (c *Controller) key(req Request) Key {
	origin := req.Remote.Unmap()
	if req.Header != nil && len(c.trusted) > 0 && c.isTrusted(origin) {
		origin = c.forwarded(origin, req)
	}
	var tenant string
	switch c.source {
	case KeyHeader:
		if req.Header != nil {
			name := c.headerHTTP
			if req.Protocol == ProtocolGRPC {
				name = c.headerGRPC
			}
			if vs := req.Header.Values(name); len(vs) > 0 {
				tenant = vs[0]
			}
		}
	case KeyAuth:
		if req.Auth != nil {
			if s, ok := req.Auth.GetAttribute(c.authAttr).(string); ok {
				tenant = s
			}
		}
	}
	return c.keys.key(origin, tenant)
}

func (c *Controller) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwarded returns the client's address a trusted proxy forwards: the
// last address of the chain in forwarded_header that is not itself a
// trusted proxy, the remote address when there is none. The other
// header is not read: a proxy passes it on as its client sent it.
func (c *Controller) forwarded(remote netip.Addr, req Request) netip.Addr {
	name := c.forwardedHTTP
	if req.Protocol == ProtocolGRPC {
		name = c.forwardedGRPC
	}
	vs := req.Header.Values(name)
	for j := len(vs) - 1; j >= 0; j-- {
		v := vs[j]
		for v != "" {
			cut := strings.LastIndexByte(v, ',')
			elem := v[cut+1:]
			v = v[:max(cut, 0)]
			a, ok := forwardedAddr(elem, c.rfc7239)
			if !ok {
				return remote // a chain we cannot read: trust none of it
			}
			if !c.isTrusted(a) {
				return a
			}
			remote = a
		}
	}
	return remote // the chain is all trusted proxies: the first of them
}

// forwardedAddr reads one element of a Forwarded (RFC 7239, its for=
// parameter) or X-Forwarded-For header.
func forwardedAddr(elem string, rfc7239 bool) (netip.Addr, bool) {
	elem = strings.TrimSpace(elem)
	if rfc7239 {
		found := false
		for part := range strings.SplitSeq(elem, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
			if ok && strings.EqualFold(k, "for") {
				elem, found = strings.Trim(v, `"`), true
				break
			}
		}
		if !found {
			return netip.Addr{}, false
		}
	}
	if ap, err := netip.ParseAddrPort(elem); err == nil {
		return ap.Addr().Unmap(), true
	}
	elem = strings.TrimSuffix(strings.TrimPrefix(elem, "["), "]")
	a, err := netip.ParseAddr(elem)
	return a.Unmap(), err == nil
}

// key returns the Key of a request from origin (its client's address)
// with tenant (the header's or the auth attribute's value; "" for none).
// A header value is nested under the origin: its key has the origin's key
// as parent and shares the origin's share, so that a client choosing its
// own values gains nothing. An auth value is a key of its own.
func (t *keyTable) key(origin netip.Addr, tenant string) Key {
	if t == nil {
		return 0
	}
	if tenant != "" && t.source == KeyAuth {
		var h maphash.Hash
		h.SetSeed(t.seed)
		h.WriteByte('a')
		h.WriteString(tenant)
		return t.claim(h.Sum64(), 0, tenant, netip.Addr{})
	}
	if !origin.IsValid() {
		return 0
	}
	var k [17]byte
	if origin = origin.Unmap(); origin.Is4() {
		v := origin.As4()
		copy(k[:], v[:])
		k[16] = 4
	} else {
		// An IPv6 client by its /64, what one host or site gets, so that
		// it cannot escape its share by changing the low bits.
		v := origin.As16()
		copy(k[:8], v[:8])
		k[16] = 6
	}
	oid := maphash.Bytes(t.seed, k[:])
	ok := t.claim(oid, 0, "", origin)
	if tenant == "" || t.source != KeyHeader {
		return ok
	}
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.Write(k[:])
	h.WriteByte('h')
	h.WriteString(tenant)
	return t.claim(h.Sum64(), ok, tenant, netip.Addr{})
}

// keyProbes is how many slots from a key's hash its slot may be: two keys
// share one only when every slot of the range is in use, so that the
// collisions of a few hundred active keys in 4096 slots are rare.
const keyProbes = 8

// claim returns the slot of id: the one already labelled with it in its
// probe range, else the first of the range that is unused or idle (no
// bytes, no places, no request for activeFor), labelled anew: its parent,
// name and weight. Top-level keys and nested ones have slots apart. When
// every slot of the range is busy, a top-level key shares its first one
// with the key there, which errs on the side of refusing, and a nested key
// is its origin's: it never shares another origin's tenant's.
func (t *keyTable) claim(id uint64, parent Key, tenant string, addr netip.Addr) Key {
	id |= 1 // 0 is an unused slot
	first := 0
	if parent != 0 {
		first = topSlots // the nested keys' half
	}
	base := int(id % topSlots)
	at := t.clock()
	for {
		free := -1
		var freeID uint64
		for p := range keyProbes {
			i := first + (base+p)%topSlots
			s := &t.slots[i]
			cur := s.id.Load()
			if cur == id {
				if parent != 0 {
					t.renest(s, parent, tenant)
				}
				return Key(i) + 1
			}
			if free < 0 && (cur == 0 || t.idle(s, at)) {
				free, freeID = i, cur
			}
		}
		if free < 0 {
			if parent != 0 {
				return parent
			}
			return Key(first+base) + 1
		}
		s := &t.slots[free]
		if !s.id.CompareAndSwap(freeID, id) {
			continue // another key took it meanwhile: look again
		}
		s.ready.Store(false)
		if freeID != 0 {
			s.forget()
		}
		t.label(s, parent, tenant, addr)
		return Key(free) + 1
	}
}

// renest keeps a nested key's slot in its origin's: the origin, idle with
// its tenants, may have lost its slot and taken another, or taken its own
// anew and forgotten that it has tenants.
func (t *keyTable) renest(s *keySlot, parent Key, tenant string) {
	if old := s.parent.Load(); old != uint32(parent) {
		// Its old origin's slot was idle, so is it; it is taken anew once.
		if s.live.Load() == 0 && s.reserved.Load() == 0 && s.held.Load() == 0 && s.parent.CompareAndSwap(old, uint32(parent)) {
			s.forget()
			t.label(s, parent, tenant, netip.Addr{})
		}
		return
	}
	if p := t.slot(parent); p != nil && !p.hasKids.Load() && !p.hasKids.Swap(true) {
		t.recounted.Store(int64(-recountEvery))
	}
}

// idle reports whether a slot's key has let go of everything and sent
// nothing for activeFor: its slot may serve another key. An origin's
// requests are its tenants' (see touch): it is idle when they are.
func (t *keyTable) idle(s *keySlot, at time.Duration) bool {
	if !s.ready.Load() || s.reserved.Load() != 0 || s.held.Load() != 0 || s.live.Load() != 0 {
		return false
	}
	seen, busy := s.seen.Load(), s.busy.Load()
	return at-time.Duration(max(seen, busy)) > activeFor
}

// forget clears what an idle slot's former key left in it.
func (s *keySlot) forget() {
	s.hasKids.Store(false)
	s.busy.Store(0)
	s.epoch.Store(0)
	for _, c := range []*counter{&s.read, &s.laneRead, &s.admitted, &s.refused} {
		c.reset()
	}
	for i := range s.arrivals {
		s.arrivals[i].reset()
		s.dropEpoch[i].Store(0)
	}
	s.sizes.Store(nil)
	s.wire.Store(nil)
}

// label gives a slot just claimed its key's parent, name and weight.
func (t *keyTable) label(s *keySlot, parent Key, tenant string, addr netip.Addr) {
	s.parent.Store(uint32(parent))
	if p := t.slot(parent); p != nil && !p.hasKids.Swap(true) {
		// An origin's first nested key changes what it may hold (capOf).
		t.recounted.Store(int64(-recountEvery))
	}
	s.seen.Store(int64(t.clock()))
	w := 1.0
	var name string
	if addr.IsValid() {
		name = addr.String()
		if addr.Is6() {
			name = netip.PrefixFrom(addr, 64).Masked().String()
		}
		for _, c := range t.cidrs {
			if c.p.Contains(addr) {
				w = c.w
				break
			}
		}
	} else {
		name = tenant
		if len(name) > maxNameLen {
			name = name[:maxNameLen]
		}
		if v, ok := t.weights[tenant]; ok {
			w = v
		}
	}
	s.name.Store(&name)
	s.weight.Store(math.Float64bits(w))
	s.ready.Store(true)
}

func (t *keyTable) slot(k Key) *keySlot {
	if t == nil || k == 0 || k > keySlots {
		return nil
	}
	return &t.slots[k-1]
}

// parentOf returns the origin of a nested key, 0 for a top-level one.
func (t *keyTable) parentOf(k Key) Key {
	if s := t.slot(k); s != nil {
		return Key(s.parent.Load())
	}
	return 0
}

// touch records a request of k for sig arriving at at, of bytes (what it is
// expected to cost: the fair drops weigh requests by it), and computes the
// shares again when that is due.
func (t *keyTable) touch(k Key, sig decision.Signal, bytes int64, at time.Duration, dec Decider) {
	if t == nil {
		return
	}
	if s := t.slot(k); s != nil {
		// The origin of a nested key is seen with it: its slot stays its own.
		for o := s; o != nil; o = t.slot(Key(o.parent.Load())) {
			if seen := o.seen.Load(); seen == 0 || at-time.Duration(seen) >= recountEvery/2 {
				o.seen.Store(int64(at))
			}
			if o.parent.Load() == 0 {
				break
			}
		}
		if sig < decision.NumSignals {
			s.arrivals[sig].add(max(bytes, 1), at, arrivalWindow)
		}
	}
	last := t.recounted.Load()
	if at-time.Duration(last) < recountEvery || !t.recounted.CompareAndSwap(last, int64(at)) {
		return
	}
	t.recount(at, dec)
}

// arrived counts n more bytes of a request of k and sig than it was
// counted for when it arrived (see Ticket.weigh).
func (t *keyTable) arrived(k Key, sig decision.Signal, n int64, at time.Duration) {
	if s := t.slot(k); s != nil && sig < decision.NumSignals && n > 0 {
		s.arrivals[sig].add(n, at, arrivalWindow)
	}
}

// offered is what a request of k is expected to cost: its length when
// known, else what its key's requests of its signal lately turned out to be
// (unknown_size before any). The fair drops weigh requests by it, so that a
// key sending ten times the bytes in as many requests is seen as sending ten
// times as much.
func (c *Controller) offered(k Key, req Request, at time.Duration) int64 {
	if req.Length > 0 {
		return req.Length
	}
	if n := c.keys.sizeOf(k, req.Signal, at, false); n > 0 {
		return n
	}
	return c.unknownSize
}

// decide is the decision for one request of key k and sig: the signal's
// state, and while it sheds, the key's fair drop (see recountDrops). One
// atomic load when the signal is Normal.
func (c *Controller) decide(k Key, sig decision.Signal) decision.Verdict {
	open, p := c.dec.Pressure(sig)
	switch {
	case open:
		return decision.VerdictDenyOpen
	case !(p > 0):
		return decision.VerdictAdmit
	}
	if rand.Uint64()>>11 < c.keys.dropThreshold(k, sig, p) {
		return decision.VerdictDenyShed
	}
	return decision.VerdictAdmit
}

// dropThreshold is the 53-bit threshold a request of k and sig is dropped
// under while its signal sheds with probability p: the key's fair drop
// when one has been computed, p itself otherwise.
func (t *keyTable) dropThreshold(k Key, sig decision.Signal, p float64) uint64 {
	if s := t.slot(k); s != nil && sig < decision.NumSignals && s.dropEpoch[sig].Load() == t.epoch.Load() {
		return s.drop[sig].Load()
	}
	return threshold(p)
}

// threshold scales a probability to 53 bits: a draw r in [0, 2^53) drops
// when r < threshold.
func threshold(p float64) uint64 {
	switch {
	case !(p > 0):
		return 0
	case p >= 1:
		return 1 << 53
	}
	return uint64(p * (1 << 53))
}

// refuse records a refusal of req and returns it.
func (c *Controller) refuse(k Key, req Request, at time.Duration, v decision.Verdict) decision.Verdict {
	c.rec.Record(req.Protocol, req.Signal, v)
	c.keys.noteDecision(k, false, at)
	if v == decision.VerdictDenyBudget {
		// Whether the budget was short is the caller's to note.
		c.keys.busy(k, at)
	}
	return v
}

// noteDecision counts an admitted or refused request of k for the
// telemetry of the busiest keys.
func (t *keyTable) noteDecision(k Key, admitted bool, at time.Duration) {
	s := t.slot(k)
	if s == nil {
		return
	}
	if admitted {
		s.admitted.add(1, at, readWindow)
	} else {
		s.refused.add(1, at, readWindow)
	}
}

// noteRefused records a refusal (or wait) of k at at for lack of budget:
// the budget is contended (see onContended).
func (t *keyTable) noteRefused(k Key, at time.Duration) {
	if t == nil {
		return
	}
	if time.Duration(t.refusedAt.Load()) < at {
		t.refusedAt.Store(int64(at))
	}
	t.noteAtShare(k, at)
}

// noteAtShare records a refusal of k at at because k (or its origin)
// holds its share, or owes the oversize lane. The budget is not contended
// by it: a key at its share with the budget free would otherwise shrink
// every key to its fair share, and the refusals that follow would renew
// it. What k's silent requests hold is looked at (see onContended).
func (t *keyTable) noteAtShare(k Key, at time.Duration) {
	if t == nil {
		return
	}
	t.busy(k, at)
	if t.onContended != nil {
		t.onContended(at)
	}
}

// busy marks k and its origin as reading (or refused for the budget) at t:
// only such keys share the budget.
func (t *keyTable) busy(k Key, at time.Duration) {
	for s := t.slot(k); s != nil; s = t.slot(Key(s.parent.Load())) {
		if b := s.busy.Load(); b == 0 || at-time.Duration(b) >= recountEvery/2 {
			s.busy.Store(int64(at))
		}
		if s.parent.Load() == 0 {
			return
		}
	}
}

// contended reports whether a request was refused for the budget, or made
// to wait for it, within contendedFor of at.
func (t *keyTable) contended(at time.Duration) bool {
	r := t.refusedAt.Load()
	return r != 0 && at-time.Duration(r) < contendedFor
}

// takePlace takes one of the hold's places for key k: for a held request,
// and for a gRPC call from the tap to the end of its wait, so that one
// max_requests bounds everything held. False when the hold is full, k holds
// its share of it, or the hold is closed or off.
func (h *hold) takePlace(k Key) bool {
	if h == nil {
		return false
	}
	select {
	case <-h.closing:
		return false
	default:
	}
	if h.held.Add(1) > h.maxHeld {
		h.held.Add(-1)
		return false
	}
	if !h.c.keys.takePlace(k, h.maxHeld) {
		h.held.Add(-1)
		return false
	}
	return true
}

// takePlace takes one of k's places in a hold of maxPlaces; false when k
// is at its share of them.
func (t *keyTable) takePlace(k Key, maxPlaces int64) bool {
	s := t.slot(k)
	if s == nil || t.share >= 1 {
		return true
	}
	lim := t.placeLimit(k, maxPlaces)
	if f := t.ownFraction(k); f < 1 {
		// An origin's own requests are one more of its tenants (limitOf).
		lim = max(int32(float64(lim)*f), 1)
	}
	if s.held.Add(1) > lim {
		s.held.Add(-1)
		return false
	}
	parent := Key(s.parent.Load())
	if p := t.slot(parent); p != nil && p.held.Add(1) > t.placeLimit(parent, maxPlaces) {
		p.held.Add(-1)
		s.held.Add(-1)
		return false
	}
	return true
}

// placeLimit is how many of maxPlaces k may hold, at least 1.
func (t *keyTable) placeLimit(k Key, maxPlaces int64) int32 {
	s := t.slot(k)
	if s == nil {
		return math.MaxInt32
	}
	f := math.Float64frombits(t.newPlaces.Load())
	if s.epoch.Load() == t.epoch.Load() {
		f = math.Float64frombits(s.places.Load())
	}
	return int32(min(max(int64(float64(maxPlaces)*f), 1), math.MaxInt32))
}

// freePlace gives back a place taken by takePlace.
func (h *hold) freePlace(k Key) {
	h.c.keys.freePlace(k)
	h.held.Add(-1)
}

// freePlace gives back a place taken by takePlace.
func (t *keyTable) freePlace(k Key) {
	s := t.slot(k)
	if s == nil || t.share >= 1 {
		return
	}
	s.held.Add(-1)
	if p := t.slot(Key(s.parent.Load())); p != nil {
		p.held.Add(-1)
	}
}

// wait holds a request of key k and sig that holds a place, decided v (a
// denial), until a decision admits it, ctx ends, the hold closes or limit
// passes. It returns VerdictAdmit, or the denial to answer with: at the end
// of the wait, a last decision as if the request had just arrived.
func (h *hold) wait(ctx context.Context, k Key, sig decision.Signal, v decision.Verdict, limit time.Duration) decision.Verdict {
	if limit <= 0 || sig >= decision.NumSignals {
		return v
	}
	w := &heldRequest{key: k, admitted: make(chan struct{})}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return v
	}
	h.waiting[sig] = append(h.waiting[sig], w)
	if !h.running {
		h.running = true
		go h.dispatch()
	}
	h.mu.Unlock()

	timer := time.NewTimer(limit)
	defer timer.Stop()
	last := false
	select {
	case <-w.admitted:
		return decision.VerdictAdmit
	case <-timer.C:
		last = true
	case <-ctx.Done():
	case <-h.closing:
	}
	h.mu.Lock()
	select {
	case <-w.admitted: // admitted while the lock was awaited
		h.mu.Unlock()
		return decision.VerdictAdmit
	default:
	}
	w.gone = true
	h.mu.Unlock()
	if !last {
		return v
	}
	return h.c.decide(k, sig)
}

// limitOf is the most key k may hold now, and its origin.
func (b *budget) limitOf(k Key, at time.Duration) (lim, parentLim int64) {
	m := b.max.Load()
	lim = b.keys.limit(k, m, at)
	parentLim = m
	if p := b.keys.parentOf(k); p != 0 {
		parentLim = b.keys.limit(p, m, at)
	} else if f := b.keys.ownFraction(k); f < 1 {
		// An origin's own requests (no tenant value, or one that found no
		// slot) are one more of its tenants: what the origin may hold is
		// its tenants', not theirs alone.
		lim, parentLim = max(int64(float64(lim)*f), 1), lim
	}
	return lim, parentLim
}

// limitsFor is limitOf for a request that is exempt or not: an exempt
// signal's request may take its key's share over by the exempt reserve.
func (b *budget) limitsFor(k Key, exempt bool, at time.Duration) (lim, parentLim int64) {
	lim, parentLim = b.limitOf(k, at)
	if exempt {
		extra := b.keepFor(false)
		lim, parentLim = lim+extra, parentLim+extra
	}
	return lim, parentLim
}

// ownFraction is the part of what an origin whose tenants are nested in it
// may hold that its own requests may: one tenant's, the configured share
// of it or, with others active, a fair part. 1 for any other key.
func (t *keyTable) ownFraction(k Key) float64 {
	s := t.slot(k)
	if s == nil || !s.hasKids.Load() {
		return 1
	}
	return min(t.share, 1/float64(s.kids.Load()+1))
}

// limit is the most that k may hold of total bytes at at, at least 1.
func (t *keyTable) limit(k Key, total int64, at time.Duration) int64 {
	return max(int64(float64(total)*t.fraction(k, at)), 1)
}

// fraction is the share of the budget k may hold at at: its fair share
// while the budget is contended, otherwise the configured share of what
// its origin may hold for a nested key (a client choosing its own header
// values holds no more than its address may), and uncontendedFraction for
// a top-level one.
func (t *keyTable) fraction(k Key, at time.Duration) float64 {
	s := t.slot(k)
	if s == nil || t.share >= 1 && t.parentOf(k) == 0 {
		return 1
	}
	if !t.contended(at) {
		if p := t.slot(Key(s.parent.Load())); p != nil {
			return t.share * t.uncontendedFraction(p)
		}
		return t.uncontendedFraction(s)
	}
	return t.fairFraction(s)
}

// uncontendedFraction is what a top-level slot may hold while the budget
// is not contended: the configured share, or an origin's fair share if
// that is more. An origin nesting tenants holds no less uncontended than
// contended: behind a proxy it is every client, and capping it at one
// client's share refused its tenants with half the budget free.
func (t *keyTable) uncontendedFraction(s *keySlot) float64 {
	if s.hasKids.Load() {
		return max(t.share, t.fairFraction(s))
	}
	return t.share
}

// fairFraction is the fair share of the slot as last computed, or that of
// a key that became active since.
func (t *keyTable) fairFraction(s *keySlot) float64 {
	if s.epoch.Load() == t.epoch.Load() {
		return math.Float64frombits(s.frac.Load())
	}
	f := math.Float64frombits(t.newFrac.Load())
	if p := t.slot(Key(s.parent.Load())); p != nil {
		pf := f
		if p.epoch.Load() == t.epoch.Load() {
			pf = math.Float64frombits(p.frac.Load())
		}
		return pf / float64(p.kids.Load()+1)
	}
	return f
}

// room is what k may still take of lim (and its origin of parentLim).
func (t *keyTable) room(k Key, lim, parentLim int64) int64 {
	s := t.slot(k)
	if s == nil {
		return lim
	}
	r := lim - s.reserved.Load()
	if p := t.slot(Key(s.parent.Load())); p != nil {
		r = min(r, parentLim-p.reserved.Load())
	}
	return max(r, 0)
}

// roomForBody is what an HTTP body of k may count on of lim: its key's
// room, and what its key's own calls give back when decoded if it may wait
// for that.
func (c *Controller) roomForBody(k Key, lim, parentLim int64) int64 {
	if c.waitsForDecodes() {
		return c.keys.bodyRoom(k, lim, parentLim)
	}
	return c.keys.room(k, lim, parentLim)
}

// waitsForDecodes reports whether an HTTP body may wait for what its key's
// own gRPC calls hold for messages still to be decoded: only with a hold,
// whose places per key bound how many wait so.
func (c *Controller) waitsForDecodes() bool {
	return c.hold != nil && c.cfg.WaitTimeout > 0 && !c.observe
}

// bodyRoom is room with what k's unary gRPC calls hold for messages still
// to be decoded counted as coming back: a decoded call keeps only its
// message's size, so a body of the same key may wait for that rather than
// be refused while its key's own calls are in the middle of decoding.
func (t *keyTable) bodyRoom(k Key, lim, parentLim int64) int64 {
	s := t.slot(k)
	if s == nil {
		return lim
	}
	r := lim - s.reserved.Load() + s.decoding.Load() - s.streaming.Load()
	if p := t.slot(Key(s.parent.Load())); p != nil {
		r = min(r, parentLim-p.reserved.Load()+p.decoding.Load()-p.streaming.Load())
	}
	return max(r, 0)
}

// addStreaming counts n bytes (negative: taken off) of k's undecoded
// calls' as its streaming calls'.
func (t *keyTable) addStreaming(k Key, n int64) {
	t.addBoth(k, n, func(s *keySlot) *atomic.Int64 { return &s.streaming })
}

// addBoth adds n to the counter of k's slot that of picks, and to its
// origin's.
func (t *keyTable) addBoth(k Key, n int64, of func(*keySlot) *atomic.Int64) {
	s := t.slot(k)
	if s == nil {
		return
	}
	of(s).Add(n)
	if p := t.slot(Key(s.parent.Load())); p != nil {
		of(p).Add(n)
	}
}

// use says what a reservation is for.
type use uint8

const (
	// useExempt: a request of an exempt signal, which may take the
	// exempt signals' reserve and its key's share over by as much.
	useExempt use = 1 << iota
	// useDecode: what a gRPC message may decode to (see callSize), which a
	// key may take while its calls still to be decoded hold less than its
	// share, or none at all, however small its share: one decode at a time
	// is always possible, and what its decoded calls hold while the
	// pipeline handles them does not hold up the next.
	useDecode
	// useOwnDecodes: an HTTP body waiting for what its key's own calls
	// hold for messages still to be decoded; its key's share, not the
	// budget, is short, so the others need not line up behind it.
	useOwnDecodes
)

func useOf(exempt bool) use {
	if exempt {
		return useExempt
	}
	return 0
}

// keepFor is what a new reservation leaves free of the budget besides the
// waiting requests' needs: the exempt reserve, unless it is exempt.
func (b *budget) keepFor(exempt bool) int64 {
	if exempt || b.exemptShare <= 0 {
		return 0
	}
	return int64(float64(b.max.Load()) * b.exemptShare)
}

// admitNow reserves n bytes for a new reservation of k that does not wait
// in line, leaving free what the waiting requests need.
func (b *budget) admitNow(n int64, k Key, u use, at time.Duration) bool {
	return b.take(n, k, b.pending.Load()+b.headKeep.Load()+b.keepFor(u&useExempt != 0), u, at)
}

// take reserves n bytes for key k if they fit in its share and in the
// budget with keep bytes left free.
func (b *budget) take(n int64, k Key, keep int64, u use, at time.Duration) bool {
	if n <= 0 {
		return true
	}
	lim, plim := b.limitsFor(k, u&useExempt != 0, at)
	if u&useDecode != 0 {
		if !b.keys.reserveDecode(k, n, max(lim, n), max(plim, n)) {
			return false
		}
	} else if !b.keys.reserve(k, n, lim, plim) {
		return false
	}
	for {
		cur := b.reserved.Load()
		if n > b.max.Load()-cur-keep {
			b.keys.add(k, -n)
			if u&useDecode != 0 {
				b.keys.endDecode(k, n)
			}
			return false
		}
		if b.reserved.CompareAndSwap(cur, cur+n) {
			b.notePeak(cur + n)
			return true
		}
	}
}

// reserveDecode adds n bytes to k's reservation (and its origin's) for a
// call still to be decoded, if what k's undecoded calls hold fits in lim
// and its origin's in parentLim; lock-free.
func (t *keyTable) reserveDecode(k Key, n, lim, parentLim int64) bool {
	if !t.claimDecode(k, n, lim, parentLim) {
		return false
	}
	t.add(k, n)
	return true
}

// claimDecode counts n bytes k holds already as its undecoded calls', if
// they fit in lim and its origin's in parentLim.
func (t *keyTable) claimDecode(k Key, n, lim, parentLim int64) bool {
	s := t.slot(k)
	if s == nil {
		return true
	}
	if !casAdd(&s.decoding, n, lim) {
		return false
	}
	if p := t.slot(Key(s.parent.Load())); p != nil && !casAdd(&p.decoding, n, parentLim) {
		s.decoding.Add(-n)
		return false
	}
	return true
}

// addLive counts n more unfinished requests of k (negative: ended), for
// its origin too.
func (t *keyTable) addLive(k Key, n int32) {
	for s := t.slot(k); s != nil; s = t.slot(Key(s.parent.Load())) {
		s.live.Add(n)
		if s.parent.Load() == 0 {
			return
		}
	}
}

// endDecode takes n bytes of k's undecoded calls off (its call's message
// has been decoded, or it ended); they stay reserved as the call's.
func (t *keyTable) endDecode(k Key, n int64) { t.addDecoding(k, -n) }

// addDecoding counts n bytes (negative: taken off) as k's undecoded
// calls', unconditionally.
func (t *keyTable) addDecoding(k Key, n int64) {
	t.addBoth(k, n, func(s *keySlot) *atomic.Int64 { return &s.decoding })
}

// decodeRoom is what k's undecoded calls may still take of lim.
func (t *keyTable) decodeRoom(k Key, lim int64) int64 {
	s := t.slot(k)
	if s == nil {
		return lim
	}
	return max(lim-s.decoding.Load(), 0)
}

// reserve adds n bytes to k's reservation (and its origin's) if they fit
// in lim and its origin's limit parentLim; lock-free.
func (t *keyTable) reserve(k Key, n, lim, parentLim int64) bool {
	s := t.slot(k)
	if s == nil {
		return true
	}
	if !casAdd(&s.reserved, n, lim) {
		return false
	}
	if p := t.slot(Key(s.parent.Load())); p != nil && !casAdd(&p.reserved, n, parentLim) {
		s.reserved.Add(-n)
		return false
	}
	return true
}

// casAdd adds n to v if the sum stays within lim.
func casAdd(v *atomic.Int64, n, lim int64) bool {
	for {
		cur := v.Load()
		// Written as a subtraction so a huge n cannot overflow.
		if n > lim-cur {
			return false
		}
		if v.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// add counts n bytes (negative: released) for k and its origin,
// unconditionally.
func (t *keyTable) add(k Key, n int64) {
	s := t.slot(k)
	if s == nil {
		return
	}
	s.reserved.Add(n)
	if p := t.slot(Key(s.parent.Load())); p != nil {
		p.reserved.Add(n)
	}
}

// notePeak raises the peak to v if v is above it.
func (b *budget) notePeak(v int64) {
	for {
		p := b.peak.Load()
		if v <= p || b.peak.CompareAndSwap(p, v) {
			return
		}
	}
}

// charge adds n bytes that are already in memory, even beyond the budget,
// so that it shows them and refuses others meanwhile.
func (b *budget) charge(n int64, k Key) {
	if n <= 0 {
		return
	}
	b.notePeak(b.reserved.Add(n))
	b.keys.add(k, n)
}

// laneIndebted reports whether key k has lately read its allowance in the
// oversize lane: the larger of the budget's size and its share of what
// every other key read in the same time. Under pressure such a key's
// requests that may need the lane are refused rather than decompressed up
// to its share first.
func (b *budget) laneIndebted(k Key, at time.Duration) bool {
	lane, all := b.keys.laneRecent(k, at)
	others := b.read.recent(at, readWindow) - all
	share := b.keys.share
	return lane >= max(b.max.Load(), int64(float64(others)*share))
}

// laneRecent is what k read in the oversize lane lately, and what it read
// in all.
func (t *keyTable) laneRecent(k Key, at time.Duration) (lane, all int64) {
	if s := t.topOf(k); s != nil {
		return s.laneRead.recent(at, readWindow), s.read.recent(at, readWindow)
	}
	return 0, 0
}

// topOf is the slot of k's origin, or of k when it is top-level: the lane's
// allowance is an origin's, so that a client cannot renew it by changing
// its header values.
func (t *keyTable) topOf(k Key) *keySlot {
	s := t.slot(k)
	if s == nil {
		return nil
	}
	if p := t.slot(Key(s.parent.Load())); p != nil {
		return p
	}
	return s
}

// admitCall admits a gRPC call the decision admits, with its estimate
// reserved (Start reserves what its message may decode to before it is
// read), or to wait for it in Ticket.Start.
func (c *Controller) admitCall(ctx context.Context, k Key, req Request, at time.Duration, exempt bool, off int64) (*Ticket, decision.Verdict) {
	n := c.estimate(k, req.Signal, exempt, at)
	switch {
	case c.budget.admitNow(n, k, useOf(exempt), at):
		t := c.newTicket(ctx, k, req, at, off)
		t.reserved = n
		return t.admitted(decision.VerdictAdmit)
	case c.observe:
		c.budget.charge(n, k)
		t := c.newTicket(ctx, k, req, at, off)
		t.reserved = n
		return t.admitted(decision.VerdictDenyBudget)
	case c.cfg.WaitTimeout > 0:
		if held, ok := c.takeHeld(k, req.Signal, at); ok {
			return c.newTicket(ctx, k, req, at, off).pending(decision.VerdictAdmit, held)
		}
	}
	c.budget.noteShort(n, k, useOf(exempt), at)
	return nil, c.refuse(k, req, at, decision.VerdictDenyBudget)
}

// minEstimate is the least a gRPC call's estimate is, so that one learnt
// from empty messages still counts every call.
const minEstimate = 4 << 10

// maxOvercommit bounds how far below a message's decoded size a call's
// estimate may be: wire size, as an HTTP body starts with its
// Content-Length, but at least a quarter of the decoded size.
const maxOvercommit = 4

// estimate is what a gRPC call of k and sig reserves at the tap: the
// largest message of an accepted call of that key and signal lately as it
// came on the wire, but at least a quarter of the largest decoded one
// (unknown_size before any), at least minEstimate, at most its key's
// share. It only decides whether the call is let in at once and bounds
// what its client may send before the call starts; Start then reserves
// what the message may decode to (callSize), whatever the estimate says.
func (c *Controller) estimate(k Key, sig decision.Signal, exempt bool, at time.Duration) int64 {
	n := c.keys.sizeOf(k, sig, at, false)
	if n == 0 {
		n = c.unknownSize
	} else if w := c.keys.sizeOf(k, sig, at, true); w > 0 {
		n = max(min(w, n), n/maxOvercommit)
	}
	n = max(n, min(minEstimate, c.unknownSize))
	lim, plim := c.budget.limitOf(k, at)
	return max(min(n, lim, plim, c.budget.max.Load()-c.budget.keepFor(exempt)), 1)
}

// sizeOf returns the largest body of k and sig learnt lately, 0 if none.
func (t *keyTable) sizeOf(k Key, sig decision.Signal, at time.Duration, wire bool) int64 {
	s := t.slot(k)
	if s == nil || sig >= decision.NumSignals {
		return 0
	}
	p := s.sizes.Load()
	if wire {
		p = s.wire.Load()
	}
	if p == nil {
		return 0
	}
	return p[sig].get(at)
}

// decodesAtOnce is how many gRPC messages as large as the budget allows may
// be decoded at once: a call reserves what its message may decode to, at
// most a quarter of the budget, before its message is read (see callSize).
const decodesAtOnce = 4

// callSize is what a gRPC call reserves from before its message is read
// until it has been decoded: what grpc-go may decode for it
// (grpc_max_message_size), but at most a quarter of the budget. grpc-go
// decompresses and decodes the whole message before anything sees its size,
// and a client's earlier messages say nothing of its next one, so no
// estimate is safe; reserving this bounds how many messages are decoded at
// once, at most four of the largest the budget allows, whatever their
// clients claim. A key whose calls still to be decoded hold nothing may
// take it whole (useDecode), so that one decode at a time is always
// possible, however small its share.
func (c *Controller) callSize() int64 {
	return max(min(c.grpcMaxMessage, c.budget.max.Load()/decodesAtOnce), 1)
}

// takeHeld takes a hold place for a gRPC call of k and sig that waits, and
// counts in the held pool what its client can send meanwhile (its stream's
// flow-control window, or its key's largest recent message on the wire):
// false when either is full.
func (c *Controller) takeHeld(k Key, sig decision.Signal, at time.Duration) (int64, bool) {
	if !c.hold.takePlace(k) {
		return 0, false
	}
	n := int64(0)
	if c.budget != nil {
		n = max(heldWindow, c.keys.sizeOf(k, sig, at, true))
		if !c.budget.reserveHeld(n) {
			c.hold.freePlace(k)
			return 0, false
		}
	}
	return n, true
}

// reserveHeld counts n bytes a waiting gRPC stream may buffer, if they fit
// in the held pool (at least the budget's size).
func (b *budget) reserveHeld(n int64) bool {
	if n <= 0 {
		return true
	}
	return casAdd(&b.held, n, max(b.heldMax.Load(), b.max.Load()))
}

// newTicket returns the ticket of an admitted (or waiting) request,
// counted in its key's arrivals as off bytes, and live in its key until
// it is released.
func (c *Controller) newTicket(ctx context.Context, k Key, req Request, at time.Duration, off int64) *Ticket {
	c.keys.addLive(k, 1)
	return &Ticket{
		c: c, ctx: ctx, key: k, sig: req.Signal, proto: req.Protocol, age: at, known: req.Length, weighed: max(off, 1),
		exempt: c.budget != nil && c.dec.Exempt(req.Signal),
	}
}

// admitted finishes the admission of a request recorded as v: counted in
// flight, in the set Close cuts off, and for an HTTP body its head start
// timed.
func (t *Ticket) admitted(v decision.Verdict) (*Ticket, decision.Verdict) {
	c := t.c
	if v.Admitted() && (t.proto == ProtocolGRPC || c.budget != nil) {
		// Recorded once its first bytes are reserved (HTTP) or its call
		// has what its message may decode to (gRPC, in Start).
		t.unrecorded = true
	} else {
		c.rec.Record(t.proto, t.sig, v)
		c.keys.noteDecision(t.key, true, t.age)
	}
	if c.budget != nil {
		t.waitLeft = c.cfg.WaitTimeout
	}
	t.w.age = t.age
	t.lastProgress = t.age
	t.mu.Lock()
	t.counted, t.allowed = true, true
	t.mu.Unlock()
	c.inflight.Add(1)
	c.tickets.add(t)
	return t, decision.VerdictAdmit
}

// pending lets a gRPC call in to wait in Start, holding a hold place and
// held bytes of the held pool: for a decision that admits it when held is
// a denial, then for want bytes (its callSize, or computed after the
// decision). It is recorded when its wait ends.
func (t *Ticket) pending(held decision.Verdict, heldBytes int64) (*Ticket, decision.Verdict) {
	t.pend, t.place, t.heldBytes, t.held = true, true, heldBytes, held
	t.w.age = t.age
	t.c.tickets.add(t)
	return t, decision.VerdictAdmit
}
