// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"hash/maphash"
	"math"
	"net"
	"net/netip"
	"sync/atomic"
	"time"
)

// DefaultPeerShare is the most of the admission budget, and of the hold's
// places, that one peer (remote IP) may have while it is the only one
// sending (admission.peer_share default): one client, or one node or proxy
// many clients come through, can never take all of them.
const DefaultPeerShare = 0.5

// minPeerShare is the floor of a peer's fair share: with many peers active
// each may still hold an eighth of the budget, so that a request of
// ordinary size always fits in its peer's share.
const minPeerShare = 1.0 / 8

// peerSlots is the number of per-peer slots. Peers are hashed into them;
// two peers in one slot share its limits, which errs on the safe side.
const peerSlots = 4096

// peerActiveFor is how long a peer counts as active after its last
// request (admitted or refused): long enough to span an exporter's back-off
// after a refusal, so that a peer refused because others hold the budget
// still counts when the shares are computed.
const peerActiveFor = 5 * time.Second

// peerRecountEvery is how often the active peers are counted again.
const peerRecountEvery = 250 * time.Millisecond

// peer is a slot index plus one; 0 is no peer (an address that is not IP).
type peer uint16

// Peers tracks the remote peers of every server of an extension: what each
// holds of the admission budget and of the hold's places, and how many are
// active. While n peers are active, each may hold at most
// max(1/n, 1/8) of the budget and of the places, and never more than the
// configured share: a peer that floods, trickles or holds cannot keep the
// others out, however few or many they are (design §11). A nil *Peers has
// no per-peer limits.
type Peers struct {
	// share is the configured peer_share; >= 1 means no per-peer limit.
	share float64
	seed  maphash.Seed
	slots [peerSlots]peerSlot

	// fraction is the share a peer may hold now, as float64 bits, derived
	// from share and the number of active peers every peerRecountEvery.
	fraction  atomic.Uint64
	recounted atomic.Int64 // now() of the last count
	active    atomic.Int32
	// refusedAt is now() of the last request refused for the budget, or
	// made to wait for it: while it is recent the budget is contended, and
	// a body grows only within its peer's fair share.
	refusedAt atomic.Int64
}

type peerSlot struct {
	reserved atomic.Int64 // bytes of the admission budget
	held     atomic.Int32 // places in the hold
	seen     atomic.Int64 // now() of the last request
	// lane counts what the peer's bodies read in the oversize lane, read
	// what its requests read in all, see laneAllowed.
	lane, read readCounter
}

// NewPeers returns the peer table for a configured peer share; share >= 1
// (or <= 0) means no per-peer limit, but peers are still told apart.
func NewPeers(share float64) *Peers {
	p := &Peers{share: share, seed: maphash.MakeSeed()}
	p.fraction.Store(math.Float64bits(p.fractionFor(1)))
	return p
}

// limited reports whether per-peer limits apply.
func (ps *Peers) limited() bool { return ps != nil && ps.share > 0 && ps.share < 1 }

// fractionFor is the share each of n active peers may hold.
func (ps *Peers) fractionFor(n int) float64 {
	if !ps.limited() {
		return 1
	}
	return min(ps.share, max(1/float64(max(n, 1)), minPeerShare))
}

// Fraction is the share of the budget and of the places one peer may hold
// now; 1 without per-peer limits.
func (ps *Peers) Fraction() float64 {
	if !ps.limited() {
		return 1
	}
	return math.Float64frombits(ps.fraction.Load())
}

// Active is the number of peers that sent a request within peerActiveFor,
// as last counted.
func (ps *Peers) Active() int {
	if ps == nil {
		return 0
	}
	return int(ps.active.Load())
}

// ofAddr returns the slot of an IP address: an IPv4 address as is, an IPv6
// one by its /64, what one host or site gets, so that a client cannot
// escape its share by changing the low bits.
func (ps *Peers) ofAddr(a netip.Addr) peer {
	if ps == nil || !a.IsValid() {
		return 0
	}
	var k [17]byte
	if a = a.Unmap(); a.Is4() {
		v := a.As4()
		copy(k[:], v[:])
		k[16] = 4
	} else {
		v := a.As16()
		copy(k[:8], v[:8])
		k[16] = 6
	}
	return peer(maphash.Bytes(ps.seed, k[:])%peerSlots) + 1
}

// ofRemote returns the slot of an http.Request's RemoteAddr.
func (ps *Peers) ofRemote(remoteAddr string) peer {
	if ps == nil {
		return 0
	}
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return 0
	}
	return ps.ofAddr(ap.Addr())
}

// ofNet returns the slot of a connection's remote address.
func (ps *Peers) ofNet(a net.Addr) peer {
	if t, ok := a.(*net.TCPAddr); ok {
		return ps.ofAddr(t.AddrPort().Addr())
	}
	return 0
}

func (ps *Peers) slot(p peer) *peerSlot {
	if ps == nil || p == 0 {
		return nil
	}
	return &ps.slots[p-1]
}

// touch marks p active at t (a request of p arrived, whatever its fate)
// and counts the active peers again when that is due. The count is a scan
// of the slots, once per peerRecountEvery by whichever request finds it
// due: a few microseconds, amortised over every request of that time.
func (ps *Peers) touch(p peer, t time.Duration) {
	if ps == nil {
		return
	}
	if s := ps.slot(p); s != nil && t-time.Duration(s.seen.Load()) >= peerRecountEvery/2 {
		s.seen.Store(int64(t))
	}
	last := ps.recounted.Load()
	if t-time.Duration(last) < peerRecountEvery || !ps.recounted.CompareAndSwap(last, int64(t)) {
		return
	}
	ps.recount(t)
}

// recount counts the peers active at t: seen within peerActiveFor, or
// still holding budget or places.
func (ps *Peers) recount(t time.Duration) {
	n := 0
	for i := range ps.slots {
		s := &ps.slots[i]
		if seen := s.seen.Load(); (seen != 0 && t-time.Duration(seen) <= peerActiveFor) || s.reserved.Load() > 0 || s.held.Load() > 0 {
			n++
		}
	}
	ps.active.Store(int32(min(n, math.MaxInt32)))
	ps.fraction.Store(math.Float64bits(ps.fractionFor(n)))
}

// contendedFor is how long after a budget refusal the budget counts as
// contended.
const contendedFor = 2 * time.Second

// limit is the most that one peer's requests may take of total when they
// are admitted: its fair share, total itself without per-peer limits, at
// least 1.
func (ps *Peers) limit(total int64) int64 {
	f := ps.Fraction()
	if f >= 1 {
		return total
	}
	return max(int64(float64(total)*f), 1)
}

// growLimit is the most that one peer may hold of total by growing its
// bodies at t: peer_share while nobody is refused for the budget (a large
// body of an honest client grows into room nobody wants), its fair share
// while the budget is contended (the others keep theirs).
func (ps *Peers) growLimit(total int64, t time.Duration) int64 {
	if !ps.limited() {
		return total
	}
	if at := ps.refusedAt.Load(); at != 0 && t-time.Duration(at) < contendedFor {
		return ps.limit(total)
	}
	return max(int64(float64(total)*ps.share), 1)
}

// refused notes a request refused for the budget at t, or made to wait
// for it.
func (ps *Peers) refused(t time.Duration) {
	if ps != nil && time.Duration(ps.refusedAt.Load()) < t {
		ps.refusedAt.Store(int64(t))
	}
}

// reserve adds n bytes to p's reservation if they fit in lim, the most one
// peer may hold; lock-free.
func (ps *Peers) reserve(p peer, n, lim int64) bool {
	s := ps.slot(p)
	if s == nil || !ps.limited() {
		ps.add(p, n)
		return true
	}
	for {
		cur := s.reserved.Load()
		// Written as a subtraction so a huge n cannot overflow.
		if n > lim-cur {
			return false
		}
		if s.reserved.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// room is what p may still take of lim, the most one peer may hold; lim
// without per-peer limits.
func (ps *Peers) room(p peer, lim int64) int64 {
	s := ps.slot(p)
	if s == nil || !ps.limited() {
		return lim
	}
	return max(lim-s.reserved.Load(), 0)
}

// add counts n bytes (negative: released) for p, unconditionally.
func (ps *Peers) add(p peer, n int64) {
	if s := ps.slot(p); s != nil {
		s.reserved.Add(n)
	}
}

// takePlace takes one of p's places in a hold of maxPlaces; false when p is
// at its share of them (at least one place each).
func (ps *Peers) takePlace(p peer, maxPlaces int64) bool {
	s := ps.slot(p)
	if s == nil {
		return true
	}
	lim := int32(min(max(int64(float64(maxPlaces)*ps.Fraction()), 1), math.MaxInt32))
	if s.held.Add(1) > lim {
		s.held.Add(-1)
		return false
	}
	return true
}

// freePlace gives back a place taken by takePlace.
func (ps *Peers) freePlace(p peer) {
	if s := ps.slot(p); s != nil {
		s.held.Add(-1)
	}
}

// laneWindow is the window over which what a peer reads in the oversize
// lane is counted. While the collector is under pressure (not Normal, or a
// level past its exit line) a peer may take the lane only while what it
// read there in the last one or two windows is less than its allowance
// (laneAllowance): a peer sending bodies larger than its share back to back
// would otherwise keep the collector decompressing and decoding for it
// alone, while peers sending large honest batches beside others read no
// more than their part of the work. While the collector has room, large
// batches go through as fast as they come.
const laneWindow = 10 * time.Second

// laneAllowance is what one peer may have read in the lane lately and
// still take it under pressure: the larger of total, the budget's size, and
// its peer_share (the whole without per-peer limits) of others, what the
// other peers read in the same windows. At the default share of one half, a
// peer owes the lane once it reads there half as much as every other peer
// together.
func (ps *Peers) laneAllowance(total, others int64) int64 {
	share := 1.0
	if ps.limited() {
		share = ps.share
	}
	return max(total, int64(float64(others)*share))
}

// laneAllowed reports whether what peer p read in the lane lately is less
// than allowance at t.
func (ps *Peers) laneAllowed(p peer, allowance int64, t time.Duration) bool {
	s := ps.slot(p)
	return s == nil || s.lane.recent(t) < allowance
}

// laneRead records that a body of p read n bytes in the lane at t.
func (ps *Peers) laneRead(p peer, n int64, t time.Duration) {
	if s := ps.slot(p); s != nil && n > 0 {
		s.lane.add(n, t)
	}
}

// noteRead records that requests of p read n bytes at t, in the lane or
// not.
func (ps *Peers) noteRead(p peer, n int64, t time.Duration) {
	if s := ps.slot(p); s != nil && n > 0 {
		s.read.add(n, t)
	}
}

// readRecent is what requests of p read lately, in the lane or not.
func (ps *Peers) readRecent(p peer, t time.Duration) int64 {
	if s := ps.slot(p); s != nil {
		return s.read.recent(t)
	}
	return 0
}

// readCounter counts bytes read in windows of laneWindow: the current
// window and the one before it, enough for a rate that one burst moves
// only for a window or two.
type readCounter struct {
	window    atomic.Int64 // index of the current window
	cur, prev atomic.Int64
}

// add counts n bytes read at t.
func (c *readCounter) add(n int64, t time.Duration) {
	c.roll(t)
	c.cur.Add(n)
}

// recent is what was read in the current window and the one before it.
func (c *readCounter) recent(t time.Duration) int64 {
	c.roll(t)
	return c.cur.Load() + c.prev.Load()
}

// roll starts the window of t if it has not started yet. A count added
// while the window turns may land in either window: a rate, not a ledger.
func (c *readCounter) roll(t time.Duration) {
	idx := int64(t / laneWindow)
	w := c.window.Load()
	if idx <= w || !c.window.CompareAndSwap(w, idx) {
		return
	}
	if idx == w+1 {
		c.prev.Store(c.cur.Swap(0))
		return
	}
	c.prev.Store(0)
	c.cur.Store(0)
}
