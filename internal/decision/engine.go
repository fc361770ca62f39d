// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package decision // import "github.com/otelthrottle/throttle/internal/decision"

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/sampler"
)

// Slot is one resource as the engine holds it to its lines: slot i of the
// configuration reads Levels[i] of each water level.
type Slot struct {
	// Name names the resource in the telemetry, the logs and the status
	// page ("cpu", "memory").
	Name string
	// Enabled false makes the slot count as safe: it never triggers a
	// transition and never blocks a recovery.
	Enabled bool
	// Enter is the slow level above which the signals start shedding.
	Enter float64
	// Exit is the slow level below which shedding stops.
	Exit float64
	// Hard is the fast level at or above which the signals are Open.
	Hard float64
	// BreachN is the number of consecutive frames every condition of the
	// slot must hold for before it counts; values below 1 count as 1.
	BreachN int
	// MaxShed caps this slot's shedding severity (in (0, 1]; 0 counts as
	// 1): the most this resource alone sheds, before the rules map
	// severity to a drop probability.
	MaxShed float64
	// Severity is how the slot's shedding severity follows its level.
	Severity Severity
	// Backstop marks a resource that kills past its limit (memory: the OOM
	// killer). Its hard line refuses even the exempt signals, and leaving
	// an Open in which it reached its hard line starts the recovery ramp.
	Backstop bool
	// Relieve is called after every frame in which the level is at or over
	// the hard line, once the decision is published, to make the level
	// fall (memory: a collection, softlimit.Relief, which decides itself
	// whether and how often); nil: nothing.
	Relieve func()
	// HoldFor bounds how long into this slot's pressure (from the frame its
	// level passed the enter or hard line to the one it is back under exit
	// and hard) the refusals it causes may be held: a pressure that has
	// outlasted the hold's longest wait is no burst the hold can bridge,
	// and holding it only delays every request it admits (a slow backend).
	// 0: as long as the pressure lasts.
	HoldFor time.Duration
}

// Severity is how a slot's shedding severity follows its level.
type Severity uint8

const (
	// SeverityLevel is how far the slow level is from enter towards hard:
	// for a level that must be acted on in the frame it is seen (memory).
	SeverityLevel Severity = iota
	// SeverityRate is the share of the load that holds the level at enter,
	// learnt by an integral controller (see slot.share): for a rate, whose
	// noise a proportional severity would turn into Open (CPU).
	SeverityRate
)

// maxShed is MaxShed with 0 (and anything out of range) as 1.
func (s Slot) maxShed() float64 {
	if s.MaxShed > 0 && s.MaxShed < 1 {
		return s.MaxShed
	}
	return 1
}

// Rule is how strongly one signal is shed (rules.<signal>).
type Rule struct {
	// Enabled false admits the signal in every state, Open included, short
	// of the memory backstop (see admissionFor).
	Enabled bool
	// DropMin and DropMax bound the drop probability in Shedding. DropMax 0
	// exempts the signal from shedding, not from Open nor from the recovery
	// ramp that follows a memory Open.
	DropMin, DropMax float64
}

// Config is the decision engine's configuration.
type Config struct {
	// Slots are the resources, in the order of the water level's Levels;
	// at most sampler.MaxResources.
	Slots []Slot
	// Rules are indexed by Signal.
	Rules [NumSignals]Rule
	// RecoveryRamp is how long, after leaving Open, the drop probability is
	// held at least on a line falling from 1 to 0; 0 disables the ramp.
	RecoveryRamp time.Duration
	// Interval is the time between two Observe calls (the sampler's
	// interval). It scales the rate controller's step per frame, so that
	// the controller reacts in the same wall time at any sample interval;
	// 0 means sampler.DefaultInterval.
	Interval time.Duration
}

// The rate controller (see slot.share). shareGain is the share's rate of
// change per second per unit of error (fast - enter): fast enough to match
// an overload within seconds, slow enough per frame to average out the
// noise of short CFS windows. shareOpenStep is added when the slot opens:
// shedding was too weak. shareNormalDecay is the smallest error the share
// unlearns at in Normal.
const (
	shareGain        = 1.0
	shareOpenStep    = 0.1
	shareNormalDecay = 0.1
)

// DefaultRule is every signal's rule unless configured: throttled, from no
// drop at the enter line to dropping all at the hard line.
func DefaultRule() Rule { return Rule{Enabled: true, DropMin: 0, DropMax: 1} }

// Transition is one state change of one signal.
type Transition struct {
	Signal   Signal
	From, To State
	// Level is the water level of the frame that caused the change.
	Level sampler.WaterLevel
}

// Options are the engine's collaborators. Every field is optional.
type Options struct {
	// Now is the clock of the recovery ramp; time.Now when nil.
	Now func() time.Time
	// OnTransition is called from Observe for every state change of every signal.
	OnTransition func(Transition)
	// Rand returns a uniform number in [0, 1); math/rand/v2 Float64 when nil.
	// It is called concurrently from the request path.
	Rand func() float64
}

// SignalStat is one signal's part of a Stat.
type SignalStat struct {
	State State
	// DropProbability is the share of requests rejected at the receivers'
	// entrance: 1 in Open, the shedding probability (or the recovery ramp)
	// otherwise; for a signal whose rule is disabled 0, but 1 at a
	// backstop's hard line and the ramp after it.
	DropProbability float64
}

// Stat is a snapshot of the engine for telemetry and logs.
type Stat struct {
	Signals [NumSignals]SignalStat
	// Level is the last level observed (the zero level before the first).
	Level sampler.WaterLevel
	// Stale is true while Expire has found the level too old and every
	// signal is admitted (see Expire).
	Stale bool
}

// Engine holds the state machines and makes the admission decisions.
//
// All signals see the same water levels against the same (global) lines
// and start in Normal, so their state machines would always be in the same
// state with the same counters. The engine therefore runs one machine (one
// set of slots, one state) and specialises per signal only what differs, the
// rule, when it publishes each signal's admission snapshot. Transitions are
// still reported per signal, as the contract and telemetry are per signal.
type Engine struct {
	rules        [NumSignals]Rule
	recoveryRamp time.Duration
	// shareStep is the rate controller's gain per frame: shareGain times
	// the interval in seconds.
	shareStep    float64
	now          func() time.Time
	onTransition func(Transition)
	rand         func() float64

	// Written by Observe only; mu keeps a misuse (two goroutines observing)
	// from racing.
	mu         sync.Mutex
	slots      []slot
	state      State
	leftOpenAt time.Time // start of the recovery ramp
	rampActive bool
	// openByBackstop: in the current Open episode a backstop slot reached
	// its hard line, so leaving it starts the recovery ramp.
	openByBackstop bool
	observedAt     time.Time // when Observe last ran, on e.now; New's time before
	stale          atomic.Bool

	// Read by the request path and Stat.
	level      atomic.Pointer[sampler.WaterLevel]
	admissions [NumSignals]atomic.Pointer[admission]
}

// admission is one signal's immutable decision snapshot: all Decide needs,
// behind one pointer so that it costs one atomic load.
type admission struct {
	state State
	// open rejects everything: the state is Open and the rule is enabled.
	open bool
	// pDrop is the probability of rejecting a request when not open.
	pDrop float64
	// threshold is pDrop scaled to 53 bits: a draw r in [0, 2^53) rejects
	// when r < threshold, which happens with probability pDrop.
	threshold uint64
	// entryDrop is an exempt signal's recovery ramp, which only the
	// receivers' entrance applies (Pressure), not Decide.
	entryDrop float64
	// noHold: every slot that presses has pressed for longer than its
	// HoldFor, so a refusal is answered at once instead of held.
	noHold bool
}

// verdict is the drop decision: at most one random draw, and only when the
// outcome is not already certain.
func (a *admission) verdict(draw func() float64) Verdict {
	switch {
	case a.open:
		return VerdictDenyOpen
	case a.pDrop <= 0:
		return VerdictAdmit
	case a.pDrop >= 1:
		return VerdictDenyShed
	case draw == nil:
		// The production path: a direct call the compiler can see, against
		// a 53-bit threshold, the same resolution as rand.Float64 without
		// an indirect call or a float conversion.
		// Branch-free (SETcc): with p near 0.5 a branch on the draw is
		// mispredicted half the time, which costs as much as the draw.
		var v Verdict
		if rand.Uint64()>>11 < a.threshold {
			v = VerdictDenyShed
		}
		return v
	case draw() < a.pDrop:
		return VerdictDenyShed
	}
	return VerdictAdmit
}

// New returns an engine in Normal for every signal.
func New(cfg Config, opts Options) *Engine {
	e := &Engine{
		rules:        cfg.Rules,
		recoveryRamp: max(cfg.RecoveryRamp, 0),
		shareStep:    shareGain * intervalOrDefault(cfg.Interval).Seconds(),
		now:          opts.Now,
		onTransition: opts.OnTransition,
		rand:         opts.Rand,
	}
	for _, s := range cfg.Slots[:min(len(cfg.Slots), sampler.MaxResources)] {
		e.slots = append(e.slots, slot{Slot: s})
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.onTransition == nil {
		e.onTransition = func(Transition) {}
	}
	// e.rand stays nil without an injected source: verdict then draws
	// from math/rand/v2 directly.
	e.observedAt = e.now()
	e.level.Store(&sampler.WaterLevel{})
	normal := &admission{state: StateNormal}
	for i := range e.admissions {
		e.admissions[i].Store(normal)
	}
	return e
}

// Decide is the request path: one atomic load and at most one random draw,
// no lock, no allocation. An unknown signal is admitted.
func (e *Engine) Decide(s Signal) Verdict {
	if s >= NumSignals {
		return VerdictAdmit
	}
	return e.admissions[s].Load().verdict(e.rand)
}

// Pressure returns whether signal s refuses everything (Open, its rule
// enabled) and otherwise its drop probability at the receivers' entrance:
// Decide without the draw, for a caller that draws against a probability of
// its own (a key's fair drop). For an exempt signal it is the recovery ramp
// after a memory Open, which Decide leaves out (see admissionFor).
func (e *Engine) Pressure(s Signal) (open bool, drop float64) {
	if s >= NumSignals {
		return false, 0
	}
	a := e.admissions[s].Load()
	return a.open, max(a.pDrop, a.entryDrop)
}

// Holdable reports whether a refusal of signal s may wait in the hold: false
// once every slot that presses has pressed for longer than its HoldFor.
func (e *Engine) Holdable(s Signal) bool {
	return s < NumSignals && !e.admissions[s].Load().noHold
}

// State returns the signal's current state.
func (e *Engine) State(s Signal) State {
	if s >= NumSignals {
		return StateNormal
	}
	return e.admissions[s].Load().state
}

// Stat returns a snapshot of every signal's state and drop probability and
// of the last level. Its parts are read one by one, not under one lock.
func (e *Engine) Stat() Stat {
	var st Stat
	for i := range e.admissions {
		a := e.admissions[i].Load()
		st.Signals[i].State = a.state
		if a.open {
			st.Signals[i].DropProbability = 1
		} else {
			st.Signals[i].DropProbability = max(a.pDrop, a.entryDrop)
		}
	}
	st.Level = *e.level.Load()
	st.Stale = e.stale.Load()
	return st
}

// admitAll is the snapshot published for every signal while the level is
// stale.
var admitAll = &admission{state: StateNormal}

// Expire is the stale-level bound. When Observe has not run for maxAge or
// longer (on the engine's clock), it publishes an admit-all Normal snapshot
// for every signal and returns true; the next Observe publishes the real
// snapshots again. maxAge <= 0 never expires. It is called by a watchdog
// goroutine other than the sampler's, so that it runs while the sampler is
// blocked; the request path is unchanged (Decide still loads one pointer).
//
// Why fall back to admitting: a stuck sampler must not leave the throttle
// rejecting everything for ever on a level nobody measures any more; a
// protection that fails must fail open. The cost is that a starved sampler
// may be starved by the very overload it should act on, hence a generous
// bound (stale_after in the extension's configuration).
//
// The check and the publication are under the lock Observe holds, so an
// Observe that lands between them cannot be overwritten by an admit-all
// snapshot based on the level it replaced. The state machine itself is kept
// (a signal in Open is still Open inside, and the first fresh frame decides
// from there) but its streak counters restart: frames on either side of a
// gap are not consecutive. State and Stat report what Decide acts on:
// Normal, with Stat.Stale set. No transition is reported for the fallback.
func (e *Engine) Expire(maxAge time.Duration) bool {
	if maxAge <= 0 {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stale.Load() {
		return true
	}
	if e.now().Sub(e.observedAt) < maxAge {
		return false
	}
	e.stale.Store(true)
	for i := range e.slots {
		e.slots[i].reset()
	}
	for i := range e.admissions {
		e.admissions[i].Store(admitAll)
	}
	return true
}

// Level returns the last water level observed: a zero (invalid) level
// before the first Observe. Lock-free, for metric callbacks.
func (e *Engine) Level() *sampler.WaterLevel { return e.level.Load() }

// Stale reports whether the engine is in the stale fallback (see Expire).
func (e *Engine) Stale() bool { return e.stale.Load() }

// ObservedAt returns when Observe last ran (on the engine's clock), or when
// the engine was created before the first Observe.
func (e *Engine) ObservedAt() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.observedAt
}

// Observe advances the state machine by one frame, publishes every signal's
// admission snapshot, then relieves the slots at their hard line. It is
// called by the sampler's goroutine after each tick; wl must not be
// modified afterwards.
func (e *Engine) Observe(wl *sampler.WaterLevel) {
	if wl == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	e.observedAt = now
	e.stale.Store(false)
	e.level.Store(wl)

	levels := &wl.Levels
	for i := range e.slots {
		// A carried-over frame is no new measurement: counting it would
		// let one reading fill a breach_n streak.
		if !levels[i].Carried {
			e.slots[i].observe(&levels[i])
		}
		e.slots[i].press(&levels[i], now)
	}

	from := e.state
	to := e.next(levels)
	// The recovery ramp guards against a backstop (memory), not a rate
	// (CPU): after a GC the memory level drops in one sample and a burst
	// let in during the next interval can exceed the headroom and
	// OOM-kill the collector. CPU overshoot only costs CFS throttling, and a
	// ramp after a CPU-only Open made the load oscillate between Open and
	// near-total shedding at 1.5 to 2 times the capacity. So the ramp
	// follows only an Open episode in which a backstop was at its hard line.
	backstop := false
	for i := range e.slots {
		if s := &e.slots[i]; s.Backstop && s.atHardNow(&levels[i]) {
			backstop = true
		}
	}
	if to == StateOpen && backstop {
		e.openByBackstop = true
	}
	if from == StateOpen && to != StateOpen {
		if e.openByBackstop && e.recoveryRamp > 0 {
			e.leftOpenAt, e.rampActive = now, true
		}
		e.openByBackstop = false
	}
	e.state = to

	ramp := e.rampAt(now)
	// With a ramp, an exempt signal's entrance refuses for the rest of an
	// Open the backstop began, as it does at the ramp that follows: another
	// resource may hold the Open after memory is back under its line.
	exemptRamp := ramp
	if to == StateOpen && e.openByBackstop && e.recoveryRamp > 0 {
		exemptRamp = 1
	}
	t := 0.0
	for i := range e.slots {
		t = max(t, e.slots[i].severity(from, to, &levels[i], e.shareStep))
	}
	noHold := !e.holdable(now)
	for i := range e.rules {
		// Publish on change only: a steady state costs no allocation.
		a := admissionFor(e.rules[i], to, t, ramp, exemptRamp, backstop)
		a.noHold = noHold
		if a != *e.admissions[i].Load() {
			published := a
			e.admissions[i].Store(&published)
		}
	}

	if from != to {
		for s := range NumSignals {
			e.onTransition(Transition{Signal: s, From: from, To: to, Level: *wl})
		}
	}

	// After publishing, so that Open takes effect before the (slow) relief.
	for i := range e.slots {
		if s := &e.slots[i]; s.Relieve != nil && s.atHardNow(&levels[i]) {
			s.Relieve()
		}
	}
}

// next is the transition table. Worsening is OR over the slots, recovery
// is AND. When a frame satisfies both Normal->Shedding and Normal->Open (or
// Shedding->Normal and Shedding->Open), Open wins: the hard line is the one
// that protects the process, and the most severe state is the safe choice.
func (e *Engine) next(levels *[sampler.MaxResources]sampler.Level) State {
	// One pass: worsening conditions OR over the slots, recovery ones AND.
	hard, enter, aboveExit := false, false, false
	exit, hardCleared := true, true
	for i := range e.slots {
		s, r := &e.slots[i], &levels[i]
		hard = hard || s.hardReached(r)
		enter = enter || s.enterReached(r)
		aboveExit = aboveExit || s.aboveExit(r)
		exit = exit && s.exitReached(r)
		hardCleared = hardCleared && s.hardCleared(r)
	}
	switch e.state {
	case StateNormal:
		switch {
		case hard:
			return StateOpen
		case enter:
			return StateShedding
		}
	case StateShedding:
		switch {
		case hard:
			return StateOpen
		case exit:
			return StateNormal
		}
	case StateOpen:
		if hardCleared {
			// Where to land is decided on this frame alone.
			if aboveExit {
				return StateShedding
			}
			return StateNormal
		}
	}
	return e.state
}

// holdable reports whether a refusal may be held now: a slot presses that
// has no HoldFor or has pressed for less than it, or none presses.
func (e *Engine) holdable(now time.Time) bool {
	pressing := false
	for i := range e.slots {
		s := &e.slots[i]
		if s.pressedSince.IsZero() {
			continue
		}
		if s.HoldFor <= 0 || now.Sub(s.pressedSince) < s.HoldFor {
			return true
		}
		pressing = true
	}
	return !pressing
}

// rampAt is the recovery ramp's floor on the drop probability: 1 when Open is
// left, falling linearly to 0 over RecoveryRamp. It is evaluated once per
// Observe, so it falls in steps of one sample interval, each step erring high.
func (e *Engine) rampAt(now time.Time) float64 {
	if !e.rampActive {
		return 0
	}
	elapsed := now.Sub(e.leftOpenAt)
	if elapsed >= e.recoveryRamp {
		e.rampActive = false
		return 0
	}
	return 1 - float64(max(elapsed, 0))/float64(e.recoveryRamp)
}

// admissionFor computes one signal's snapshot. t is the shedding severity in
// [0, 1], ramp the recovery ramp's floor, exemptRamp an exempt signal's at
// the entrance, and backstop whether memory is at or over its hard line in
// this frame.
func admissionFor(r Rule, state State, t, ramp, exemptRamp float64, backstop bool) admission {
	a := admission{state: state}
	if !r.Enabled {
		// An exempt signal is admitted in every state but one: memory at
		// its hard line. A flood on an exempt signal would otherwise meet
		// the OOM killer, which loses everything, the exempt signal too.
		a.open = backstop
		// The receivers' entrance ramps it up again after a memory Open,
		// as the others: right after the relief's GC the level reads far
		// under the line, and every exempt request held or sent again
		// during the Open would go in on that one frame. Decide (the
		// processor) does not: what reaches it is decoded already, and
		// refusing it would only lose it.
		a.entryDrop = exemptRamp
		return a
	}
	if state == StateOpen {
		a.open = true
		return a
	}
	// DropMax 0 exempts the signal from shedding, not from what follows a
	// memory Open: the ramp guards the same OOM risk as Open itself.
	if state == StateShedding && r.DropMax > 0 {
		a.pDrop = clamp01(r.DropMin + (r.DropMax-r.DropMin)*t)
	}
	a.pDrop = max(a.pDrop, ramp)
	a.threshold = uint64(a.pDrop * (1 << 53))
	return a
}

// slot is a Slot with its consecutive-frame counters. Each counter is the
// length of the current streak of frames in which its condition held; a frame
// in which it does not hold resets it. The counters depend on the frames only,
// not on the state, so they need no reset on transitions: a transition's own
// condition already implies the opposite streaks are 0.
type slot struct {
	Slot
	aboveEnter int // slow > enter
	atHard     int // fast >= hard
	belowExit  int // slow < exit
	belowHard  int // fast < hard
	// share is a SeverityRate slot's severity, an integral controller: in
	// Shedding each new frame adds step*(fast - enter), so it rises while
	// the level is above the enter line and falls while it is below, and
	// settles on the share of load that holds the level at enter whatever
	// the overload factor. A proportional severity cannot: to shed half
	// the load it needs the level halfway to the hard line, where the noise
	// of the fast level reaches hard and the state relays between Shedding
	// and Open. It is kept through Open (raised by shareOpenStep when the
	// slot opens), through frames without a new reading and through the
	// stale fallback (like the state itself), and unlearnt in Normal.
	share float64
	// pressedSince is when the level passed the enter or hard line, zero
	// once it is back under both exit and hard (see HoldFor).
	pressedSince time.Time
}

// safe reports whether the slot counts as safe in this frame: disabled, or
// its level is invalid (or not a number).
func (s *slot) safe(r *sampler.Level) bool {
	return !s.Enabled || !r.Valid || math.IsNaN(r.Slow) || math.IsNaN(r.Fast)
}

// reset breaks every streak.
func (s *slot) reset() { s.aboveEnter, s.atHard, s.belowExit, s.belowHard = 0, 0, 0, 0 }

func (s *slot) observe(r *sampler.Level) {
	if s.safe(r) {
		s.reset()
		return
	}
	s.aboveEnter = streak(s.aboveEnter, r.Slow > s.Enter)
	s.atHard = streak(s.atHard, r.Fast >= s.Hard)
	s.belowExit = streak(s.belowExit, r.Slow < s.Exit)
	s.belowHard = streak(s.belowHard, r.Fast < s.Hard)
}

// press follows the slot's pressure by its streaks: it starts when the
// level counts as past enter or hard and ends when it counts as back under
// exit and hard.
func (s *slot) press(r *sampler.Level, now time.Time) {
	switch {
	case s.enterReached(r) || s.hardReached(r):
		if s.pressedSince.IsZero() {
			s.pressedSince = now
		}
	case s.exitReached(r) && s.hardCleared(r):
		s.pressedSince = time.Time{}
	}
}

func (s *slot) breachN() int { return max(s.BreachN, 1) }

// Worsening conditions: a safe slot never triggers.
func (s *slot) enterReached(r *sampler.Level) bool { return !s.safe(r) && s.aboveEnter >= s.breachN() }
func (s *slot) hardReached(r *sampler.Level) bool  { return !s.safe(r) && s.atHard >= s.breachN() }

// Recovery conditions: a safe slot never blocks.
func (s *slot) exitReached(r *sampler.Level) bool { return s.safe(r) || s.belowExit >= s.breachN() }
func (s *slot) hardCleared(r *sampler.Level) bool { return s.safe(r) || s.belowHard >= s.breachN() }

// atHardNow reports whether the level is at or over the hard line in this
// frame (no streak): a backstop's refusal of the exempt signals, and the
// relief.
func (s *slot) atHardNow(r *sampler.Level) bool { return !s.safe(r) && r.Fast >= s.Hard }

// aboveExit is the current-frame test that picks Shedding over Normal when
// leaving Open.
func (s *slot) aboveExit(r *sampler.Level) bool { return !s.safe(r) && r.Slow > s.Exit }

// severity is the slot's share of the shedding severity in this frame, in
// [0, MaxShed]: a SeverityRate slot's controller advanced by one frame, or
// how far a SeverityLevel slot's slow level is from enter towards hard.
func (s *slot) severity(from, to State, r *sampler.Level, step float64) float64 {
	if s.Severity == SeverityRate {
		s.updateShare(from, to, r, step)
		return s.share
	}
	return min(s.levelSeverity(r), s.maxShed())
}

// updateShare advances the rate controller by one frame (see share).
func (s *slot) updateShare(from, to State, r *sampler.Level, step float64) {
	switch {
	case !s.Enabled:
		s.share = 0
	case s.safe(r) || r.Carried:
		// Nothing new measured (a failed read, or a repeated frame): keep
		// the share. Integrating a repeated reading would count it twice,
		// and dropping the share would leave the next Shedding episode
		// several seconds to learn it again (a single failed read turns
		// Shedding into Normal, since an invalid slot counts as safe).
	case to == StateOpen:
		if from != StateOpen && s.hardReached(r) {
			s.share = min(clamp01(s.share+shareOpenStep), s.maxShed())
		}
	case to == StateNormal:
		// Not used in Normal, only unlearnt: at least as fast as with the
		// level 0.1 under enter (a full share is gone within 10 s), faster
		// the lower it is. A load that comes back within seconds finds the
		// share it left.
		s.share = min(clamp01(s.share+step*min(r.Fast-s.Enter, -shareNormalDecay)), s.maxShed())
	default: // Shedding
		// Capped where it is integrated, so that it does not wind up above
		// the cap and stay there after the load has gone.
		s.share = min(clamp01(s.share+step*(r.Fast-s.Enter)), s.maxShed())
	}
}

// levelSeverity is how far the slow level is from enter towards hard,
// clamped to [0, 1]; 0 for a safe slot.
func (s *slot) levelSeverity(r *sampler.Level) float64 {
	if s.safe(r) {
		return 0
	}
	span := s.Hard - s.Enter
	if span <= 0 { // not a valid config; avoid a division by zero or a sign flip
		if r.Slow > s.Enter {
			return 1
		}
		return 0
	}
	return clamp01((r.Slow - s.Enter) / span)
}

// streak extends a streak when the condition holds and breaks it otherwise.
// It saturates instead of overflowing.
func streak(n int, holds bool) int {
	if !holds {
		return 0
	}
	if n == math.MaxInt {
		return n
	}
	return n + 1
}

func intervalOrDefault(d time.Duration) time.Duration {
	if d <= 0 {
		return sampler.DefaultInterval
	}
	return d
}

func clamp01(x float64) float64 {
	switch {
	case x > 1:
		return 1
	case x > 0:
		return x
	default: // also NaN
		return 0
	}
}
