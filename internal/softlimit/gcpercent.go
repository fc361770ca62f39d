// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package softlimit // import "github.com/otelthrottle/throttle/internal/softlimit"

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// defaultGCPercent is the GC percent the throttle starts from and gives
// back, and the one the memory level's held-back heap is counted against
// while the GC percent is raised: GOGC's default.
const defaultGCPercent = 100

// maxGCPercent bounds the raise: the heap may grow to 101 times what the GC
// scans before it collects. Beyond it a raise saves nothing measurable (it
// only matters while almost nothing is live, when a collection is cheap),
// and the runtime keeps GOGC in an int32, so a larger value would wrap
// negative and turn the GC off.
const maxGCPercent = 10_000

// gcPercentStep is the least relative change of the GC percent worth a
// call into the runtime: it follows what is live at every sample, and small
// moves only churn the GC's pacer.
const gcPercentStep = 0.10

// setGCPercent is the runtime's setter, a variable only so that
// GCPercentOptions can default to it.
var setGCPercent = debug.SetGCPercent

// processGCPercent makes sure one GCPercent at a time in the process sets
// GOGC.
var processGCPercent atomic.Bool

// GCPercentOptions are the GCPercent's collaborators; every field is
// optional.
type GCPercentOptions struct {
	// SetGCPercent is debug.SetGCPercent when nil.
	SetGCPercent func(int) int
	// Getenv is os.Getenv when nil.
	Getenv func(string) string
	// Current reads the GC percent in force; the runtime's
	// /gc/gogc:percent when nil.
	Current func() int
}

// GCPercent owns the garbage collector's percent (GOGC) while a soft memory
// limit is in force: it lets the heap grow between two collections until
// the working set reaches a target share of the container's memory limit,
// while what is live is small, and falls back to GOGC's default as what is
// live grows. What is resident besides the heap (the binary, stacks, the
// runtime's own) comes off the target, so a small container gets a small
// raise or none.
//
// Why: at GOGC=100 a collector that holds little collects every time its
// heap doubles, which for a receiver decoding requests of a few hundred KiB
// is many times a second, and the throttle's own budget, which holds what
// is in flight small, keeps the heap small (docs/decisions.md has the
// measurements, under "The GC's pace"). The memory the container has is there to be used: a
// higher GC percent trades it for CPU, and the soft memory limit, which
// binds whatever the GC percent, keeps the heap under it if what is live
// grows faster than the GC percent follows.
type GCPercent struct {
	target float64
	set    func(int) int
	status Status

	// mu: Release may run while a late sample's Update does.
	mu      sync.Mutex
	current int // the GC percent this GCPercent set; 0 while it has set none
	// released makes Release idempotent and Update a no-op after it.
	released bool
}

// AcquireGCPercent decides whether the throttle owns the GC percent
// (decideOwner: a target of 0 turns it off; GOGC is the variable). A
// GCPercent that does not own never changes it.
func AcquireGCPercent(target float64, opts GCPercentOptions) *GCPercent {
	p := &GCPercent{target: target, set: opts.SetGCPercent}
	if p.set == nil {
		p.set = setGCPercent
	}
	current := opts.Current
	if current == nil {
		current = runtimeGCPercent
	}
	p.status = decideOwner(target > 0, opts.Getenv, "GOGC", current() == defaultGCPercent, &processGCPercent)
	return p
}

// Status says who sets the GC percent.
func (p *GCPercent) Status() Status { return p.status }

// String says who sets the GC percent, for the start-up log. Safe on nil
// (no GCPercent: the throttle reads another process's figures).
func (p *GCPercent) String() string {
	if p == nil {
		return "not set by throttle (the resource source is not this process)"
	}
	switch p.status {
	case Disabled:
		return "not set by throttle (memory::soft_limit::heap_target: 0)"
	case Environment:
		return "set by the GOGC environment variable"
	}
	return p.status.String()
}

// Owned reports whether this GCPercent sets GOGC: the memory level then
// counts the heap against GOGC's default. Safe on nil.
func (p *GCPercent) Owned() bool { return p != nil && p.status == Owned }

// Update sets the GC percent for the figures of the last collection (see
// GCPercentFor), when this GCPercent owns it: the heap's target is the
// target share of memLimit less what the working set holds besides the
// heap's objects and its free memory. softLimit is the soft memory limit in
// force (math.MaxInt64: none): without one the GC percent goes back to
// GOGC's default, since nothing would then bound the heap but the GC
// percent. It reports the GC percent in force and whether this call changed
// it. Cheap when nothing changed: the sampler calls it with every sample.
func (p *GCPercent) Update(memLimit uint64, softLimit int64, workingSet uint64, h HeapFigures) (percent int, changed bool) {
	if !p.Owned() {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return 0, false
	}
	want := defaultGCPercent
	if memLimit > 0 && softLimit != noLimit {
		besides := float64(workingSet) - float64(h.Objects) - float64(h.Free)
		want = GCPercentFor(p.target*float64(memLimit)-max(besides, 0), h)
	}
	if p.current != 0 && want != defaultGCPercent && math.Abs(float64(want-p.current)) < gcPercentStep*float64(p.current) {
		return p.current, false
	}
	if want == p.current || (p.current == 0 && want == defaultGCPercent) {
		return want, false
	}
	p.set(want)
	p.current = want
	return want, true
}

// Release gives GOGC's default back. Idempotent, and safe on nil.
func (p *GCPercent) Release() {
	if !p.Owned() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return
	}
	p.released = true
	if p.current != 0 && p.current != defaultGCPercent {
		p.set(defaultGCPercent)
	}
	processGCPercent.Store(false)
}

// heapMinimum is the runtime's smallest heap goal at GOGC=100; it scales
// with GOGC, so a GC percent raised while almost nothing is live must keep
// it under the target too.
const heapMinimum = 4 << 20

// GCPercentFor is the GOGC at which the GC's heap goal for the figures h,
// live + (live + stacks + globals) × GOGC/100, and its minimum heap,
// 4 MiB × GOGC/100, are at most target bytes, within GOGC's default and
// maxGCPercent; the default while nothing has been measured.
func GCPercentFor(target float64, h HeapFigures) int {
	scan := float64(h.Live + h.Stacks + h.Globals)
	if scan <= 0 {
		return defaultGCPercent
	}
	percent := min(100*(target-float64(h.Live))/scan, 100*target/heapMinimum)
	if !(percent > defaultGCPercent) { // also NaN
		return defaultGCPercent
	}
	return int(min(percent, maxGCPercent))
}

// CurrentGCPercent returns the GC percent in force (GOGC), whoever set it;
// 0 for GOGC=off.
func CurrentGCPercent() int64 {
	g := runtimeGCPercent()
	if g == math.MaxInt32 {
		return 0
	}
	return int64(g)
}

// runtimeGCPercent reads the GC percent in force (GOGC=off:
// math.MaxInt32).
func runtimeGCPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return defaultGCPercent
	}
	return int(min(s[0].Value.Uint64(), math.MaxInt32))
}
