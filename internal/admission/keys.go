// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"cmp"
	"hash/maphash"
	"math"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// Key is a request's fairness key as the controller tracks it: one slot of
// a table of fixed size. Keys are hashed into the slots with a seed chosen
// at start, so that no client can aim at another's slot, and a key takes
// the first free slot of a few from its hash (see claim); two keys share a
// slot only when all of those are busy, which errs on the side of
// refusing. The zero Key is no key (an address that is not IP): it has no
// per-key limits.
type Key uint32

// keySlots is the number of tracked keys: memory stays bounded however
// many addresses or header values clients use.
const keySlots = 4096

// topSlots is how many of the slots are for top-level keys (addresses,
// auth values); the other half is for the keys nested in them (header
// values), so that a client naming new header values without end cannot
// take the slots of other clients' addresses.
const topSlots = keySlots / 2

// activeFor is how long a key counts towards the shares after it last read
// a byte or was refused for the budget: long enough to span an exporter's
// back-off after a refusal, so that a key refused because others hold the
// budget still counts when the shares are computed. An HTTP request that
// sends no byte does not make its key active, since it holds nothing until
// its first byte; a gRPC call holds its estimate from the tap on, and its key
// counts while it does (trimSilent bounds calls that send nothing).
const activeFor = 5 * time.Second

// recountEvery is how often the shares and the fair drops are computed
// again, by whichever request finds it due.
const recountEvery = 250 * time.Millisecond

// contendedFor is how long after a budget refusal the budget counts as
// contended: then every key holds at most its fair share, otherwise up to
// the configured share (room nobody wants).
const contendedFor = 2 * time.Second

// readWindow is the window of the read counters: what a key read lately,
// for the oversize lane's allowance.
const readWindow = 10 * time.Second

// arrivalWindow is the window of the arrival counters the fair drops are
// computed from: short, so that the drops follow a key that starts or
// stops a flood within a second or two.
const arrivalWindow = time.Second

// maxNameLen bounds a key's name in the telemetry and on the status page.
const maxNameLen = 64

type keySlot struct {
	id     atomic.Uint64 // hash of the key the slot holds now; 0: unused
	parent atomic.Uint32 // the origin's Key of a nested key; 0: top-level
	name   atomic.Pointer[string]
	weight atomic.Uint64 // float64 bits

	// frac is the slot's fair share of the budget (float64 bits) and epoch
	// the recount it was computed at; places its fair share of the hold.
	frac, places atomic.Uint64
	epoch        atomic.Int64
	kids         atomic.Int32 // active nested keys of an origin

	reserved atomic.Int64 // bytes of the admission budget
	// decoding is what the key's gRPC calls still to be decoded hold of it;
	// streaming the part of it its streaming calls hold, which comes back
	// only when they end.
	decoding, streaming atomic.Int64
	held                atomic.Int32 // places in the hold
	seen                atomic.Int64 // now() of the last request
	busy                atomic.Int64 // now() of the last byte read or budget refusal
	// live counts the key's unfinished requests (tickets): an admitted
	// body may hold nothing for longer than a key's idleness, and its slot
	// must stay its key's (and its origin's) until it ends.
	live atomic.Int32

	hasKids atomic.Bool // an origin some nested key names as parent
	// ready: the slot's key is labelled (parent, name, weight). A slot
	// just claimed is not, and the recount passes it over until it is:
	// with its weight not written yet, it would get a share of nothing.
	ready atomic.Bool

	read, laneRead    counter // bytes, readWindow
	admitted, refused counter // requests, readWindow
	arrivals          [decision.NumSignals]counter
	// drop is the fair drop of each signal as a 53-bit threshold, computed
	// at the recount dropEpoch says.
	drop      [decision.NumSignals]atomic.Uint64
	dropEpoch [decision.NumSignals]atomic.Int64
	sizes     atomic.Pointer[[decision.NumSignals]sizeWindow]
	wire      atomic.Pointer[[decision.NumSignals]sizeWindow]
}

// keyTable tracks every key of one extension: what each holds of the
// budget and of the hold's places, its shares, and its fair drops.
type keyTable struct {
	source  KeySource
	share   float64
	seed    maphash.Seed
	weights map[string]float64
	cidrs   []weightedPrefix
	slots   [keySlots]keySlot

	recounted atomic.Int64 // now() of the last recount
	epoch     atomic.Int64
	// newFrac and newPlaces are the shares of a key that became active
	// since the last recount (float64 bits).
	newFrac, newPlaces atomic.Uint64
	active             atomic.Int32
	refusedAt          atomic.Int64 // now() of the last budget refusal or wait

	mu      sync.Mutex // guards scratch, the recount's working space
	scratch recountScratch

	// clock is now, or a test's clock.
	clock func() time.Duration
	// onContended runs when a request is refused for the budget or waits
	// for it (see Controller.trimSilent); nil: nothing.
	onContended func(at time.Duration)
}

type weightedPrefix struct {
	p netip.Prefix
	w float64
}

type recountScratch struct {
	kidsWeight, kidsPlaceW, arrivalsW [keySlots]float64
	kids                              [keySlots]int32
	// busy and placed are each slot's as the first pass saw them: a key
	// that turns busy between the passes is not counted in the sums, and
	// must not be shared as if it were.
	busy, placed [keySlots]bool
	flows        []flow
}

// flow is one key's arrivals of a signal for the fair drops.
type flow struct {
	slot    int
	arrived float64
	weight  float64
}

func newKeyTable(cfg FairnessConfig) *keyTable {
	t := &keyTable{source: cfg.Key, share: cfg.Share, seed: maphash.MakeSeed()}
	if t.source == "" {
		t.source = KeyAddress
	}
	if !(t.share > 0 && t.share <= 1) {
		t.share = 1
	}
	for k, w := range cfg.Weights {
		if t.source == KeyAddress {
			if p, err := parsePrefix(k); err == nil {
				t.cidrs = append(t.cidrs, weightedPrefix{p, w})
			}
			continue
		}
		if t.weights == nil {
			t.weights = map[string]float64{}
		}
		t.weights[k] = w
	}
	// Longest prefix first: the most specific range wins.
	slices.SortFunc(t.cidrs, func(a, b weightedPrefix) int { return cmp.Compare(b.p.Bits(), a.p.Bits()) })
	t.newFrac.Store(math.Float64bits(t.share))
	t.newPlaces.Store(math.Float64bits(t.share))
	// Recounts are numbered from 1: a slot's zero epoch is never current.
	t.epoch.Store(1)
	t.clock = now
	return t
}

// noteRead records that a request of k read n bytes at at, in the lane or
// not, for its origin too.
func (t *keyTable) noteRead(k Key, n int64, lane bool, at time.Duration) {
	if n <= 0 {
		return
	}
	t.busy(k, at)
	for s := t.slot(k); s != nil; s = t.slot(Key(s.parent.Load())) {
		s.read.add(n, at, readWindow)
		if lane {
			s.laneRead.add(n, at, readWindow)
		}
		if s.parent.Load() == 0 {
			return
		}
	}
}

// learn records the size of an accepted request of k and sig.
func (t *keyTable) learn(k Key, sig decision.Signal, n int64, at time.Duration, wire bool) {
	s := t.slot(k)
	if s == nil || sig >= decision.NumSignals {
		return
	}
	ptr := &s.sizes
	if wire {
		ptr = &s.wire
	}
	w := ptr.Load()
	if w == nil {
		w = new([decision.NumSignals]sizeWindow)
		if !ptr.CompareAndSwap(nil, w) {
			w = ptr.Load()
		}
	}
	w[sig].observe(n, at)
}

// capOf is the most of the budget a top-level slot's fair share may be
// while the budget is contended: the configured share for a key, the whole
// of it for an origin whose nested keys are what the share bounds (behind
// a proxy, the tenants: the proxy is every client). Uncontended, an origin
// holds at most the share (see fraction), so that a client that chooses
// its own header values gains nothing by it.
func (t *keyTable) capOf(s *keySlot) float64 {
	if s.hasKids.Load() {
		return 1
	}
	return t.share
}

// decodingOver reports whether k's undecoded calls hold more than lim.
func (t *keyTable) decodingOver(k Key, lim int64) bool {
	s := t.slot(k)
	return s != nil && s.decoding.Load() > lim
}

// recount computes, at at, every key's fair shares of the budget and of
// the hold, and for every signal that sheds, every key's fair drop. Only
// busy keys (a byte read or a budget refusal lately, or bytes held) share
// the budget, and only those and the keys holding places share the hold:
// requests that send nothing cannot shrink the others' shares.
func (t *keyTable) recount(at time.Duration, dec Decider) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sc := &t.scratch
	epoch := t.epoch.Load() + 1
	clear(sc.kidsWeight[:])
	clear(sc.kidsPlaceW[:])
	clear(sc.kids[:])
	clear(sc.busy[:])
	clear(sc.placed[:])
	var topW, placeW float64
	n := 0
	isBusy := func(s *keySlot) bool {
		b := s.busy.Load()
		return s.reserved.Load() > 0 || (b != 0 && at-time.Duration(b) <= activeFor)
	}
	for i := range t.slots {
		s := &t.slots[i]
		if s.id.Load() == 0 || !s.ready.Load() {
			continue
		}
		w := math.Float64frombits(s.weight.Load())
		busy := isBusy(s)
		placed := busy || s.held.Load() > 0
		sc.busy[i], sc.placed[i] = busy, placed
		if p := s.parent.Load(); p != 0 {
			if busy {
				sc.kidsWeight[p-1] += w
				sc.kids[p-1]++
			}
			if placed {
				sc.kidsPlaceW[p-1] += w
			}
			continue
		}
		if busy {
			topW += w
			n++
		}
		if placed {
			placeW += w
		}
	}
	// The origins and top-level keys first, then the keys nested in them.
	for pass := range 2 {
		for i := range t.slots {
			s := &t.slots[i]
			parent := s.parent.Load()
			if s.id.Load() == 0 || !s.ready.Load() || (pass == 0) != (parent == 0) {
				continue
			}
			w := math.Float64frombits(s.weight.Load())
			busy, placed := sc.busy[i], sc.placed[i]
			var frac, places float64
			if parent == 0 {
				// A key not counted yet is counted as if it had just joined.
				c := t.capOf(s)
				frac = min(c, w/(topW+boolW(!busy, w)))
				places = min(c, w/(placeW+boolW(!placed, w)))
				s.kids.Store(sc.kids[i])
			} else {
				p := &t.slots[parent-1]
				frac = math.Float64frombits(p.frac.Load()) * min(t.share, w/(sc.kidsWeight[parent-1]+boolW(!busy, w)))
				places = math.Float64frombits(p.places.Load()) * min(t.share, w/(sc.kidsPlaceW[parent-1]+boolW(!placed, w)))
			}
			s.frac.Store(math.Float64bits(frac))
			s.places.Store(math.Float64bits(places))
			s.epoch.Store(epoch)
		}
	}
	t.newFrac.Store(math.Float64bits(min(t.share, 1/(topW+1))))
	t.newPlaces.Store(math.Float64bits(min(t.share, 1/(placeW+1))))
	t.active.Store(int32(n))
	t.recountDrops(at, epoch, dec)
	t.epoch.Store(epoch)
}

func boolW(b bool, w float64) float64 {
	if b {
		return w
	}
	return 0
}

// recountDrops computes, for every signal that sheds with probability p,
// each key's drop so that the keys that send more than their weighted fair
// share of the bytes are refused first (approximate fair dropping):
// with f the fair rate per unit of weight such that the keys' admitted
// requests, min(arrived, f × weight) each, add up to 1 − p of all that
// arrived, a key is dropped with probability 1 − f × weight / arrived.
// Nine quiet tenants and one sending ten times as much: the quiet ones are
// not refused at all while the noisy one's excess is. A key nested in an
// origin weighs its share of the origin's weight.
func (t *keyTable) recountDrops(at time.Duration, epoch int64, dec Decider) {
	if dec == nil {
		return
	}
	sc := &t.scratch
	for sig := range decision.NumSignals {
		open, p := dec.Pressure(sig)
		if open || !(p > 0 && p < 1) {
			continue
		}
		// The weights of the origins and top-level keys that sent requests,
		// and of the nested keys within their origin.
		clear(sc.arrivalsW[:])
		var topW float64
		sc.flows = sc.flows[:0]
		for i := range t.slots {
			s := &t.slots[i]
			if s.id.Load() == 0 {
				continue
			}
			a := s.arrivals[sig].recent(at, arrivalWindow)
			if a == 0 {
				continue
			}
			w := math.Float64frombits(s.weight.Load())
			if parent := s.parent.Load(); parent != 0 {
				if sc.arrivalsW[parent-1] == 0 {
					topW += math.Float64frombits(t.slots[parent-1].weight.Load())
				}
				sc.arrivalsW[parent-1] += w
			} else {
				topW += w
			}
			sc.flows = append(sc.flows, flow{slot: i, arrived: float64(a), weight: w})
		}
		if len(sc.flows) == 0 || topW == 0 {
			continue
		}
		var total float64
		for j := range sc.flows {
			f := &sc.flows[j]
			if parent := t.slots[f.slot].parent.Load(); parent != 0 {
				pw := math.Float64frombits(t.slots[parent-1].weight.Load())
				f.weight = pw / topW * f.weight / sc.arrivalsW[parent-1]
			} else {
				f.weight /= topW
			}
			total += f.arrived
		}
		fair := fairRate(sc.flows, (1-p)*total)
		for _, f := range sc.flows {
			d := 0.0
			if limit := fair * f.weight; f.arrived > limit {
				d = 1 - limit/f.arrived
			}
			s := &t.slots[f.slot]
			s.drop[sig].Store(threshold(d))
			s.dropEpoch[sig].Store(epoch)
		}
	}
}

// fairRate returns f, the admitted requests per unit of weight such that
// the sum over flows of min(arrived, f × weight) is target (water filling).
// It sorts flows.
func fairRate(flows []flow, target float64) float64 {
	slices.SortFunc(flows, func(a, b flow) int { return cmp.Compare(a.arrived/a.weight, b.arrived/b.weight) })
	rest, weight := target, 0.0
	for _, f := range flows {
		weight += f.weight
	}
	for _, f := range flows {
		if weight <= 0 {
			break
		}
		if f.arrived <= rest*f.weight/weight*(1+1e-9) { // rounding: the last may fit exactly
			rest -= f.arrived
			weight -= f.weight
			continue
		}
		return rest / weight
	}
	return math.Inf(1)
}

// KeyStat is what one key holds and how its requests fared lately: the
// telemetry and the status page show the busiest.
type KeyStat struct {
	Name     string
	Reserved int64
	Held     int32
	Admitted int64 // requests admitted in the last 10 to 20 s
	Refused  int64 // requests refused in the last 10 to 20 s
}

// top returns the n busiest keys, by bytes held, then places held, then
// requests refused and admitted lately, and the sum of the others as
// "other".
func (t *keyTable) top(n int, at time.Duration) (top []KeyStat, other KeyStat) {
	if t == nil {
		return nil, KeyStat{}
	}
	var all []KeyStat
	for i := range t.slots {
		s := &t.slots[i]
		if s.id.Load() == 0 {
			continue
		}
		ks := KeyStat{
			Reserved: s.reserved.Load(),
			Held:     s.held.Load(),
			Admitted: s.admitted.recent(at, readWindow),
			Refused:  s.refused.recent(at, readWindow),
		}
		if ks == (KeyStat{}) {
			continue
		}
		if s.hasKids.Load() {
			continue // an origin's figures are its nested keys'
		}
		if name := s.name.Load(); name != nil {
			ks.Name = *name
		}
		all = append(all, ks)
	}
	slices.SortFunc(all, func(a, b KeyStat) int {
		return cmp.Or(cmp.Compare(b.Reserved, a.Reserved), cmp.Compare(b.Held, a.Held),
			cmp.Compare(b.Refused, a.Refused), cmp.Compare(b.Admitted, a.Admitted), cmp.Compare(a.Name, b.Name))
	})
	if len(all) <= n {
		return all, KeyStat{Name: "other"}
	}
	other = KeyStat{Name: "other"}
	for _, ks := range all[n:] {
		other.Reserved += ks.Reserved
		other.Held += ks.Held
		other.Admitted += ks.Admitted
		other.Refused += ks.Refused
	}
	return all[:n], other
}
