// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"fmt"
	"math"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// fakeDecider is a Decider with a settable pressure per signal; set its
// fields before the controller runs, or through setOpen and setDrop.
type fakeDecider struct {
	open    [decision.NumSignals]atomic.Bool
	drop    [decision.NumSignals]atomic.Uint64 // float64 bits
	exempt  [decision.NumSignals]bool
	pressed atomic.Bool
	// standing: the pressure has outlasted the hold (Holdable false).
	standing atomic.Bool
}

func (d *fakeDecider) setOpen(s decision.Signal, v bool)    { d.open[s].Store(v) }
func (d *fakeDecider) setDrop(s decision.Signal, p float64) { d.drop[s].Store(math.Float64bits(p)) }
func (d *fakeDecider) dropOf(s decision.Signal) float64 {
	return math.Float64frombits(d.drop[s].Load())
}

func (d *fakeDecider) Pressure(s decision.Signal) (bool, float64) {
	return d.open[s].Load(), d.dropOf(s)
}
func (d *fakeDecider) Exempt(s decision.Signal) bool { return d.exempt[s] }
func (d *fakeDecider) Pressed(decision.Signal) bool  { return d.pressed.Load() }
func (d *fakeDecider) Holdable(decision.Signal) bool { return !d.standing.Load() }

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// t0 is a time late enough that no window of the counters is the first.
const t0 = time.Hour

func TestKeyOf(t *testing.T) {
	hdr := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.5})
	a := hdr.key(addr("10.0.0.1"), "")
	a1 := hdr.key(addr("10.0.0.1"), "tenant-1")
	a2 := hdr.key(addr("10.0.0.1"), "tenant-2")
	b1 := hdr.key(addr("10.0.0.2"), "tenant-1")
	require.NotZero(t, a)
	assert.NotEqual(t, a1, a2)
	assert.NotEqual(t, a1, b1, "a header value is nested under its client's address")
	assert.Equal(t, a, hdr.parentOf(a1))
	assert.Equal(t, a, hdr.parentOf(a2))
	assert.Zero(t, hdr.parentOf(a))
	assert.Equal(t, a1, hdr.key(addr("::ffff:10.0.0.1"), "tenant-1"), "IPv4-mapped is IPv4")
	assert.Zero(t, hdr.key(netip.Addr{}, "tenant-1"), "no address, no key")

	auth := newKeyTable(FairnessConfig{Key: KeyAuth, Share: 0.5})
	s1 := auth.key(addr("10.0.0.1"), "subject-1")
	assert.Equal(t, s1, auth.key(addr("10.0.0.2"), "subject-1"), "an authenticated subject is one key wherever it comes from")
	assert.Zero(t, auth.parentOf(s1))
	anon := auth.key(addr("10.0.0.1"), "")
	assert.Equal(t, anon, auth.key(addr("10.0.0.1"), ""), "unauthenticated: by address")
	assert.NotEqual(t, anon, auth.key(addr("10.0.0.2"), ""), "unauthenticated: by address")

	byAddr := newKeyTable(FairnessConfig{Key: KeyAddress, Share: 0.5})
	assert.Equal(t, byAddr.key(addr("2001:db8:1:2::1"), ""), byAddr.key(addr("2001:db8:1:2:ffff::9"), ""), "IPv6 by its /64")
	assert.NotEqual(t, byAddr.key(addr("2001:db8:1:2::1"), ""), byAddr.key(addr("2001:db8:1:3::1"), ""))
	assert.Equal(t, byAddr.key(addr("10.0.0.1"), "ignored"), byAddr.key(addr("10.0.0.1"), ""))
	name := byAddr.slot(byAddr.key(addr("2001:db8:1:2::1"), "")).name.Load()
	assert.Equal(t, "2001:db8:1:2::/64", *name)
}

func TestKeyWeights(t *testing.T) {
	byAddr := newKeyTable(FairnessConfig{Key: KeyAddress, Share: 0.5, Weights: map[string]float64{"10.0.0.0/8": 2, "10.1.0.0/16": 4}})
	w := func(k Key) float64 { return math.Float64frombits(byAddr.slot(k).weight.Load()) }
	assert.InDelta(t, 4, w(byAddr.key(addr("10.1.2.3"), "")), 0, "the longest prefix wins")
	assert.InDelta(t, 2, w(byAddr.key(addr("10.2.2.3"), "")), 0)
	assert.InDelta(t, 1, w(byAddr.key(addr("192.0.2.1"), "")), 0)

	hdr := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.5, Weights: map[string]float64{"gold": 4}})
	w = func(k Key) float64 { return math.Float64frombits(hdr.slot(k).weight.Load()) }
	assert.InDelta(t, 4, w(hdr.key(addr("10.0.0.1"), "gold")), 0)
	assert.InDelta(t, 1, w(hdr.key(addr("10.0.0.1"), "silver")), 0)
}

// busyAt marks k as reading at at.
func busyAt(t *keyTable, k Key, at time.Duration) { t.noteRead(k, 1, false, at) }

func TestSharesFollowReads(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyAddress, Share: 0.5})
	honest := kt.key(addr("127.0.0.1"), "")
	var attackers []Key
	for i := 2; i <= 9; i++ {
		attackers = append(attackers, kt.key(addr(fmt.Sprintf("127.0.0.%d", i)), ""))
	}
	// Eight addresses that send requests but no byte have no share: the
	// one that reads keeps the whole of its own.
	busyAt(kt, honest, t0)
	for _, k := range attackers {
		kt.touch(k, decision.SignalTraces, 1, t0, nil)
	}
	kt.recount(t0, nil)
	kt.noteRefused(honest, t0) // contended: fair shares bind
	assert.InDelta(t, 0.5, kt.fraction(honest, t0), 1e-9, "silent requests do not shrink a share")

	// Eight that read: nine shares of a ninth, never more than the whole.
	for _, k := range attackers {
		busyAt(kt, k, t0)
	}
	kt.recount(t0, nil)
	sum := kt.fraction(honest, t0)
	assert.InDelta(t, 1.0/9, kt.fraction(honest, t0), 1e-9)
	for _, k := range attackers {
		sum += kt.fraction(k, t0)
	}
	assert.InDelta(t, 1, sum, 1e-9, "the shares add up to the budget, no more")

	// Uncontended, each may hold the configured share.
	assert.InDelta(t, 0.5, kt.fraction(honest, t0+contendedFor), 1e-9)
	// Five seconds after their last byte, the others no longer count.
	busyAt(kt, honest, t0+activeFor+time.Second)
	kt.recount(t0+activeFor+time.Second, nil)
	kt.noteRefused(honest, t0+activeFor+time.Second)
	assert.InDelta(t, 0.5, kt.fraction(honest, t0+activeFor+time.Second), 1e-9)
}

func TestSharesWeighted(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.9, Weights: map[string]float64{"gold": 4}})
	gold := kt.key(addr("10.0.0.1"), "gold")
	silver := kt.key(addr("10.0.0.2"), "silver")
	busyAt(kt, gold, t0)
	busyAt(kt, silver, t0)
	kt.recount(t0, nil)
	kt.noteRefused(gold, t0)
	// Each origin (address) weighs 1 at the top; within it, its tenants
	// share its part by their weights.
	assert.InDelta(t, 0.5, kt.fraction(kt.parentOf(gold), t0), 1e-9)
	assert.InDelta(t, 0.9*0.5, kt.fraction(gold, t0), 1e-9, "alone in its origin: the share of it")

	// Two tenants behind one proxy, the only client: 4 to 1 of the whole
	// budget while it is contended (the proxy is every client).
	proxied := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.9, Weights: map[string]float64{"gold": 4}})
	g := proxied.key(addr("10.0.0.9"), "gold")
	s := proxied.key(addr("10.0.0.9"), "silver")
	busyAt(proxied, g, t0)
	busyAt(proxied, s, t0)
	proxied.recount(t0, nil)
	proxied.noteRefused(g, t0)
	assert.InDelta(t, 0.8, proxied.fraction(g, t0), 1e-9)
	assert.InDelta(t, 0.2, proxied.fraction(s, t0), 1e-9)
	// Uncontended, the proxy (alone, every client) may hold the whole
	// budget, as it may contended, and each tenant the share of it.
	assert.InDelta(t, 1, proxied.fraction(proxied.parentOf(g), t0+contendedFor), 1e-9)
	assert.InDelta(t, 0.9, proxied.fraction(s, t0+contendedFor), 1e-9)
	// Beside another client, the proxy is one of two: the share.
	other := proxied.key(addr("10.0.0.10"), "bronze")
	busyAt(proxied, other, t0)
	proxied.recount(t0, nil)
	assert.InDelta(t, 0.9, proxied.fraction(proxied.parentOf(g), t0+contendedFor), 1e-9)
	assert.InDelta(t, 0.9*0.9, proxied.fraction(g, t0+contendedFor), 1e-9)
}

// TestRotatingHeaderValuesGainNothing: a client that sends a new header
// value with every request holds no more than its address may.
func TestRotatingHeaderValuesGainNothing(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.5})
	const total = 1 << 20
	var held int64
	for i := range 100 {
		k := kt.key(addr("10.0.0.1"), fmt.Sprint("tenant-", i))
		lim := kt.limit(k, total, t0)
		plim := kt.limit(kt.parentOf(k), total, t0)
		if kt.reserve(k, lim, lim, plim) {
			held += lim
		}
	}
	assert.LessOrEqual(t, held, int64(total/2), "the address's share, whatever the header values")
	assert.Positive(t, held)
	// Another address still has its own.
	other := kt.key(addr("10.0.0.2"), "tenant-0")
	assert.True(t, kt.reserve(other, total/4, kt.limit(other, total, t0), kt.limit(kt.parentOf(other), total, t0)))
}

func TestFairRate(t *testing.T) {
	f := func(arrived []float64, target, want float64) {
		t.Helper()
		flows := make([]flow, len(arrived))
		for i, a := range arrived {
			flows[i] = flow{slot: i, arrived: a, weight: 1 / float64(len(arrived))}
		}
		got := fairRate(flows, target)
		assert.InDelta(t, want, got, 1e-9, "%v %v", arrived, target)
	}
	// Nine quiet ones and a noisy one, room for ten: the noisy one gets one.
	f([]float64{1, 1, 1, 1, 1, 1, 1, 1, 1, 10}, 10, 1*10)
	// Room for everything: no limit.
	f([]float64{1, 2, 3}, 6, math.Inf(1))
	// Equal flows share equally.
	f([]float64{4, 4}, 4, 2*2)
}

func TestFairDrops(t *testing.T) {
	dec := &fakeDecider{}
	kt := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.5})
	// Ten tenants behind one proxy: nine send 10 requests a second, one 100.
	var quiet []Key
	for i := range 9 {
		quiet = append(quiet, kt.key(addr("10.0.0.9"), fmt.Sprint("quiet-", i)))
	}
	noisy := kt.key(addr("10.0.0.9"), "noisy")
	at := t0
	for range 10 {
		for _, k := range quiet {
			kt.touch(k, decision.SignalTraces, 1000, at, nil)
		}
	}
	for range 100 {
		kt.touch(noisy, decision.SignalTraces, 1000, at, nil)
	}
	// The collector can take 100 of the 190: p = 1 - 100/190.
	dec.setDrop(decision.SignalTraces, 1-100.0/190)
	kt.recount(at, dec)
	d := func(k Key) float64 {
		return float64(kt.dropThreshold(k, decision.SignalTraces, dec.dropOf(decision.SignalTraces))) / (1 << 53)
	}
	for _, k := range quiet {
		assert.Zero(t, d(k), "a quiet tenant is not refused")
	}
	// The noisy one is left the rest, its fair share: 10 of its 100.
	assert.InDelta(t, 0.9, d(noisy), 1e-9)
	// With less room than the quiet ones send, they share it equally too.
	dec.setDrop(decision.SignalTraces, 1-50.0/190)
	kt.recount(at, dec)
	assert.InDelta(t, 0.5, d(quiet[0]), 1e-9)
	assert.InDelta(t, 0.95, d(noisy), 1e-9)
	// A key not seen in the window is dropped with the signal's
	// probability until the next count.
	fresh := kt.key(addr("10.0.0.9"), "fresh")
	assert.InDelta(t, dec.dropOf(decision.SignalTraces), d(fresh), 1e-9)
	// Other signals are not dropped for traces' pressure.
	assert.Zero(t, kt.dropThreshold(noisy, decision.SignalMetrics, 0))
}

func TestTopKeys(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyAddress, Share: 0.5})
	for i := 1; i <= 12; i++ {
		k := kt.key(addr(fmt.Sprintf("10.0.0.%d", i)), "")
		kt.add(k, int64(i*100))
		kt.noteDecision(k, false, t0)
	}
	top, other := kt.top(3, t0)
	require.Len(t, top, 3)
	assert.Equal(t, KeyStat{Name: "10.0.0.12", Reserved: 1200, Refused: 1}, top[0])
	assert.Equal(t, "10.0.0.10", top[2].Name)
	assert.Equal(t, KeyStat{Name: "other", Reserved: 100 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9), Refused: 9}, other)
}

// TestKeysDistinctSlots: keys take the first free slot near their hash, so
// that a few hundred active keys rarely share one; an idle slot serves a
// new key, which does not inherit what its former key left.
func TestKeysDistinctSlots(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyAddress, Share: 0.5})
	clock := t0
	kt.clock = func() time.Duration { return clock }
	seen := map[Key]bool{}
	shared := 0
	for i := range 500 {
		k := kt.key(addr(fmt.Sprintf("10.%d.%d.1", i/200, i%200)), "")
		if seen[k] {
			shared++
		}
		seen[k] = true
	}
	// The hash seed is random: with 8 probes in 2048 slots, some key of
	// 500 finds its whole range taken in about 2 % of seeds, three in
	// about 1 of 7,000, four in none of 20,000 simulated.
	assert.LessOrEqual(t, shared, 3, "keys sharing a slot")
	// A slot idle for longer than activeFor is taken by the next key that
	// needs it, forgetting what its former key read; the others are not.
	old := kt.key(addr("10.0.0.1"), "")
	kt.slot(old).read.add(1000, t0, readWindow)
	clock = t0 + 2*activeFor
	for k := range seen {
		if k != old {
			kt.slot(k).seen.Store(int64(clock))
		}
	}
	for i := 0; ; i++ {
		k := kt.key(addr(fmt.Sprintf("192.0.%d.%d", i/250, i%250)), "")
		if k == old {
			assert.Zero(t, kt.slot(k).read.recent(t0, readWindow), "the former key's reads are forgotten")
			// The busy keys kept their slots.
			for i := 1; i < 500; i++ {
				assert.True(t, seen[kt.key(addr(fmt.Sprintf("10.%d.%d.1", i/200, i%200)), "")])
			}
			break
		}
		require.Less(t, i, 100000, "the idle slot was never taken")
	}
}

// TestFairDropsByBytes: a key sending as many requests as the others, but
// ten times the bytes in each, is seen as sending ten times as much.
func TestFairDropsByBytes(t *testing.T) {
	dec := &fakeDecider{}
	kt := newKeyTable(FairnessConfig{Key: KeyAddress, Share: 0.5})
	small := kt.key(addr("10.0.0.1"), "")
	large := kt.key(addr("10.0.0.2"), "")
	for range 10 {
		kt.touch(small, decision.SignalTraces, 10<<10, t0, nil)
		kt.touch(large, decision.SignalTraces, 100<<10, t0, nil)
	}
	dec.setDrop(decision.SignalTraces, 1-20.0/110) // room for 20 of the 110 units
	kt.recount(t0, dec)
	d := func(k Key) float64 { return float64(kt.dropThreshold(k, decision.SignalTraces, 0.5)) / (1 << 53) }
	assert.InDelta(t, 0, d(small), 1e-9)
	assert.InDelta(t, 0.9, d(large), 1e-9)
}

// TestRotatingHeaderValuesCannotFillTheTable: one address sending a new
// header value in every request (bodyless requests will do) fills the
// slots near every hash; another client must still have a key of its own,
// not share one of that address's tenants and be held within its share.
func TestRotatingHeaderValuesCannotFillTheTable(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.5})
	kt.clock = func() time.Duration { return t0 }
	attacker := addr("10.0.0.1")
	origin := kt.key(attacker, "")
	for i := range 2 * keySlots {
		kt.key(attacker, fmt.Sprint("v-", i))
	}
	for i := range 200 {
		a := addr(fmt.Sprintf("10.1.%d.%d", i/200, i%200))
		k := kt.key(a, "")
		require.NotZero(t, k)
		assert.Zero(t, kt.parentOf(k), "an address is nobody's tenant")
		assert.NotEqual(t, origin, k)
		tk := kt.key(a, "t1")
		assert.NotEqual(t, origin, kt.parentOf(tk), "another address's tenant is not the attacker's")
	}
}

// TestOriginSlotsFreedWhenIdle: an address whose requests once carried a
// tenant header is an origin; once it and its tenants are idle, its slot
// serves another address like any idle slot. Otherwise addresses that sent
// one request each with a header value (many IPv6 /64s) would keep every
// slot for ever, and every new client would share one.
func TestOriginSlotsFreedWhenIdle(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyHeader, Share: 0.5})
	clock := t0
	kt.clock = func() time.Duration { return clock }
	for i := range 2 * keySlots {
		a := addr(fmt.Sprintf("2001:db8:%x::1", i))
		kt.touch(kt.key(a, "t"), decision.SignalTraces, 1, clock, nil)
	}
	clock += 2 * activeFor
	for i := range 200 {
		a := addr(fmt.Sprintf("10.1.%d.%d", i/200, i%200))
		k := kt.key(a, "")
		assert.Equal(t, a.String(), *kt.slot(k).name.Load(), "a slot of its own")
	}
	// An origin whose tenant keeps sending keeps its slot.
	a := addr("10.2.0.1")
	kid := kt.key(a, "t")
	origin := kt.parentOf(kid)
	for range 3 {
		clock += activeFor / 2
		kt.touch(kt.key(a, "t"), decision.SignalTraces, 1, clock, nil)
		assert.True(t, kt.idle(kt.slot(kid), clock) == false && kt.idle(kt.slot(origin), clock) == false)
	}
}

// TestRecountSkipsASlotBeingLabelled: a recount that runs between a slot's
// claim and its labelling (its weight not written yet) must not leave the
// key a share of nothing until the next recount: it counts as a key that
// has just joined. Under a loaded machine the window is wide enough that a
// new key's requests were refused their places and bytes.
func TestRecountSkipsASlotBeingLabelled(t *testing.T) {
	kt := newKeyTable(FairnessConfig{Key: KeyAddress, Share: 0.5})
	kt.clock = func() time.Duration { return t0 }
	s := &kt.slots[0]
	s.id.Store(7) // claimed by a request, not labelled yet
	kt.recount(t0, nil)
	kt.label(s, 0, "", addr("10.0.0.1"))
	k := Key(1)
	assert.EqualValues(t, 4, kt.placeLimit(k, 8), "half of the places, the share of a key alone")
	kt.noteRefused(k, t0) // contended: the fair share binds
	assert.InDelta(t, 0.5, kt.fraction(k, t0), 1e-9, "half of the budget")
}
