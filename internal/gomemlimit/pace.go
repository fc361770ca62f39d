// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package gomemlimit // import "github.com/otelthrottle/throttle/internal/gomemlimit"

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// DefaultHeapTarget is the default share of the container's memory limit
// the working set may reach between two collections while what is live is
// small: well under the soft limit (DefaultShare) and the memory lines, so
// that the heap's growth between two samples stays inside the soft limit.
const DefaultHeapTarget = 0.50

// basePace is the GC pace the throttle starts from and gives back, and the
// one the memory level's held-back heap is counted against while the pace
// is raised: GOGC's default.
const basePace = 100

// paceStep is the least relative change of the pace worth a call into the
// runtime: the pace follows what is live at every sample, and small moves
// only churn the GC's pacer.
const paceStep = 0.10

// setGCPercent is the runtime's setter, a variable only so that
// PaceOptions can default to it.
var setGCPercent = debug.SetGCPercent

// processPace makes sure one Pace at a time in the process sets GOGC.
var processPace atomic.Bool

// PaceOptions are the Pace's collaborators; every field is optional.
type PaceOptions struct {
	// SetGCPercent is debug.SetGCPercent when nil.
	SetGCPercent func(int) int
	// Getenv is os.Getenv when nil.
	Getenv func(string) string
	// GCPercent reads the pace in force; the runtime's /gc/gogc:percent
	// when nil.
	GCPercent func() int
}

// Pace owns the garbage collector's pace (GOGC) while a soft memory limit
// is in force: it lets the heap grow between two collections until the
// working set reaches a target share of the container's memory limit,
// while what is live is small, and falls back to GOGC's default as what is
// live grows. What is resident besides the heap (the binary, stacks, the
// runtime's own) comes off the target, so a small container gets a small
// raise or none.
//
// Why: at GOGC=100 a collector that holds little collects every time its
// heap doubles, which for a receiver decoding requests of a few hundred KiB
// is many times a second, and the throttle's own budget, which holds what
// is in flight small, keeps the heap small (docs/design.md §11 has the
// measurements). The memory the
// container has is there to be used: a higher pace trades it for CPU, and
// the soft memory limit, which binds whatever the pace, keeps the heap
// under it if what is live grows faster than the pace follows.
type Pace struct {
	target float64
	set    func(int) int
	status Status

	// mu: Release may run while a late sample's Update does.
	mu      sync.Mutex
	current int // the pace this Pace set; 0 while it has set none
	// released makes Release idempotent and Update a no-op after it.
	released bool
}

// AcquirePace decides whether the throttle owns the pace (decideOwner: a
// target of 0 turns it off; GOGC is the variable). A Pace that does not own
// never changes it.
func AcquirePace(target float64, opts PaceOptions) *Pace {
	p := &Pace{target: target, set: opts.SetGCPercent}
	if p.set == nil {
		p.set = setGCPercent
	}
	gcPercent := opts.GCPercent
	if gcPercent == nil {
		gcPercent = runtimeGCPercent
	}
	p.status = decideOwner(target > 0, opts.Getenv, "GOGC", gcPercent() == basePace, &processPace)
	return p
}

// Status says who sets the pace.
func (p *Pace) Status() Status { return p.status }

// String says who sets the pace, for the start-up log. Safe on nil (no
// Pace: the throttle reads another process's figures).
func (p *Pace) String() string {
	if p == nil {
		return "not set by throttle (the resource source is not this process)"
	}
	switch p.status {
	case Disabled:
		return "not set by throttle (gomemlimit.heap_target: 0)"
	case Environment:
		return "set by the GOGC environment variable"
	}
	return p.status.String()
}

// Owned reports whether this Pace sets GOGC: the memory level then counts
// the heap against GOGC's default pace. Safe on nil.
func (p *Pace) Owned() bool { return p != nil && p.status == Owned }

// Update sets the pace for the figures of the last collection (see
// PaceFor), when this Pace owns it: the heap's target is the target share
// of memLimit less what the working set holds besides the heap's objects
// and its free memory. softLimit is the soft memory limit in force
// (math.MaxInt64: none): without one the pace goes back to GOGC's default,
// since nothing would then bound the heap but the pace. It reports the pace
// in force and whether this call changed it. Cheap when nothing changed:
// the sampler calls it with every sample.
func (p *Pace) Update(memLimit uint64, softLimit int64, workingSet uint64, h HeapFigures) (pace int, changed bool) {
	if !p.Owned() {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return 0, false
	}
	want := basePace
	if memLimit > 0 && softLimit != noLimit {
		besides := float64(workingSet) - float64(h.Objects) - float64(h.Free)
		want = PaceFor(p.target*float64(memLimit)-max(besides, 0), h)
	}
	if p.current != 0 && want != basePace && math.Abs(float64(want-p.current)) < paceStep*float64(p.current) {
		return p.current, false
	}
	if want == p.current || (p.current == 0 && want == basePace) {
		return want, false
	}
	p.set(want)
	p.current = want
	return want, true
}

// Release gives GOGC's default back. Idempotent, and safe on nil.
func (p *Pace) Release() {
	if !p.Owned() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return
	}
	p.released = true
	if p.current != 0 && p.current != basePace {
		p.set(basePace)
	}
	processPace.Store(false)
}

// heapMinimum is the runtime's smallest heap goal at GOGC=100; it scales
// with the pace, so a pace raised while almost nothing is live must keep it
// under the target too.
const heapMinimum = 4 << 20

// PaceFor is the GOGC at which the GC's heap goal for the figures h,
// live + (live + stacks + globals) × GOGC/100, and its minimum heap,
// 4 MiB × GOGC/100, are at most target bytes; never below GOGC's default,
// and the default while nothing has been measured.
func PaceFor(target float64, h HeapFigures) int {
	scan := float64(h.Live + h.Stacks + h.Globals)
	if scan <= 0 {
		return basePace
	}
	pace := min(100*(target-float64(h.Live))/scan, 100*target/heapMinimum)
	if pace <= basePace {
		return basePace
	}
	return int(pace)
}

// CurrentPace returns the GC's pace in force (GOGC), whoever set it; 0 for
// GOGC=off.
func CurrentPace() int64 {
	g := runtimeGCPercent()
	if g == math.MaxInt32 {
		return 0
	}
	return int64(g)
}

// runtimeGCPercent reads the pace in force (GOGC=off: math.MaxInt32).
func runtimeGCPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return basePace
	}
	return int(min(s[0].Value.Uint64(), math.MaxInt32))
}
