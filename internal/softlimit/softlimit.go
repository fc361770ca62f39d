// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package softlimit owns the Go runtime's soft memory limit
// (runtime/debug.SetMemoryLimit) and the GC percent (GOGC, see GCPercent)
// for a collector in a container, and reads how hard that limit is
// squeezing the heap.
//
// Why: without a soft limit the garbage collector lets the heap grow to
// twice what is live (GOGC=100) before it collects. A collector holding
// acknowledged data (batches, exporter queues) near its container's limit
// then reaches the limit between two collections, and either dies or lives
// on in the kernel's reclaim and forced collections, neither dead nor
// making progress. A soft limit under the container's limit makes the
// collector collect instead, and HeapView tells the throttle how much of
// the heap the limit is holding back, so that it sheds load before the
// extra collections eat the CPU that draining needs.
package softlimit // import "github.com/otelthrottle/throttle/internal/softlimit"

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// noLimit is the runtime's value for "no soft memory limit".
const noLimit = math.MaxInt64

// Status says who sets the soft limit.
type Status int

// Statuses.
const (
	// Owned: this Owner sets the limit.
	Owned Status = iota
	// Disabled: the configuration turned ownership off.
	Disabled
	// Environment: GOMEMLIMIT is set; the runtime applied it at start.
	Environment
	// AlreadySet: something in the process set a limit before the throttle
	// started (a library, another component).
	AlreadySet
	// OtherOwner: another throttle extension in this process owns it.
	OtherOwner
)

func (s Status) String() string {
	switch s {
	case Owned:
		return "owned by throttle"
	case Disabled:
		return "not set by throttle (memory::soft_limit::enabled: false)"
	case Environment:
		return "set by the GOMEMLIMIT environment variable"
	case AlreadySet:
		return "already set in the process before throttle started"
	case OtherOwner:
		return "owned by another throttle extension in this process"
	}
	return "unknown"
}

// setMemoryLimit is the runtime's setter, a variable only so that Options
// can default to it.
var setMemoryLimit = debug.SetMemoryLimit

// processOwner makes sure one Owner at a time in the process sets the
// limit: the runtime has one limit, and two owners would fight over it.
var processOwner atomic.Bool

// Options are the Owner's collaborators; every field is optional.
type Options struct {
	// SetMemoryLimit is debug.SetMemoryLimit when nil.
	SetMemoryLimit func(int64) int64
	// Getenv is os.Getenv when nil.
	Getenv func(string) string
}

// Owner sets the soft memory limit from the container's memory limit and
// follows it when it changes.
type Owner struct {
	share  float64
	set    func(int64) int64
	status Status

	mu      sync.Mutex
	prev    int64 // the limit found at Acquire, restored by Release
	current int64 // the limit this owner set; 0 before the first Update
	// released makes Release idempotent and Update a no-op after it.
	released bool
}

// Acquire decides whether the throttle owns the soft limit: not when
// disabled, not when GOMEMLIMIT is set, not when the runtime already has a
// limit (someone else set it), not when another Owner in this process has
// it. An Owner that does not own never changes the limit.
func Acquire(cfg Config, opts Options) *Owner {
	o := &Owner{share: cfg.Share, set: opts.SetMemoryLimit}
	if o.set == nil {
		o.set = setMemoryLimit
	}
	o.status = decideOwner(cfg.Enabled, opts.Getenv, "GOMEMLIMIT", o.set(-1) == noLimit, &processOwner)
	if o.status == Owned {
		o.prev = noLimit
	}
	return o
}

// decideOwner is the ownership rule of a runtime setting (the soft limit,
// the GC percent): not when turned off, not when its environment variable is
// set, not when it is no longer the runtime's default (someone in the
// process set it), not when another owner in the process holds it (owner,
// taken on success). getenv is os.Getenv when nil.
func decideOwner(enabled bool, getenv func(string) string, envVar string, untouched bool, owner *atomic.Bool) Status {
	if getenv == nil {
		getenv = os.Getenv
	}
	switch {
	case !enabled:
		return Disabled
	case getenv(envVar) != "":
		return Environment
	case !untouched:
		return AlreadySet
	case !owner.CompareAndSwap(false, true):
		return OtherOwner
	}
	return Owned
}

// Status says who sets the limit.
func (o *Owner) Status() Status { return o.status }

// Limit returns the soft limit the runtime applies now (math.MaxInt64:
// none), whoever set it, through the Owner's setter.
func (o *Owner) Limit() int64 { return o.set(-1) }

// Update sets the soft limit to Share of memLimit, when this Owner owns it
// and memLimit is known (> 0); with no container limit it restores the
// limit found at Acquire. It reports the limit in force and whether this
// call changed it. Cheap when nothing changed: the sampler calls it with
// every sample.
func (o *Owner) Update(memLimit uint64) (limit int64, changed bool) {
	if o.status != Owned {
		return o.set(-1), false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.released {
		return o.set(-1), false
	}
	want := o.prev
	if memLimit > 0 {
		want = int64(math.Min(float64(memLimit)*o.share, float64(noLimit)))
	}
	if want == o.current {
		return want, false
	}
	o.set(want)
	o.current = want
	return want, true
}

// Release gives the limit back: it restores the limit found at Acquire,
// so that a collector that reloads its configuration without this
// extension is not left with a limit nobody follows. Idempotent, and safe
// on nil.
func (o *Owner) Release() {
	if o == nil || o.status != Owned {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.released {
		return
	}
	o.released = true
	if o.current != 0 {
		o.set(o.prev)
	}
	processOwner.Store(false)
}

// Current returns the soft memory limit the runtime applies now
// (math.MaxInt64: none), whoever set it.
func Current() int64 { return setMemoryLimit(-1) }

// reliefEvery is the least time between two of the relief's own
// collections: a fixed cadence, not a back-off (backing off when "the GC did
// not help" leaves dead zones in which Open holds for ever), and a bound on
// what collecting a heap full of live data costs a collector that is stuck
// at its hard line.
const reliefEvery = time.Second

// Relief is the throttle's memory relief at its memory hard line: the
// engine calls it after every frame at or over the line. Not safe for
// concurrent use: the sampler's goroutine calls it.
type Relief struct {
	cycles   []metrics.Sample
	lastSeen uint64
	// lastForced is when the relief last collected.
	lastForced time.Time
	// gc is runtime.GC and now time.Now, variables for tests.
	gc  func()
	now func() time.Time
}

// NewRelief returns a Relief.
func NewRelief() *Relief {
	r := &Relief{cycles: []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}, gc: runtime.GC, now: time.Now}
	r.lastSeen = r.gcCycles()
	return r
}

// Relieve renews the heap figures the memory level counts when nothing
// else does. The live heap and the freed memory behind HeapView's figures
// are measured by a collection, and a collector that the throttle has
// cut off allocates too little to start one: its level would stay at the
// hard line, and the throttle Open, with nothing left in it. So it runs a
// collection when none has run since its previous call, one frame earlier
// while memory stays at the line (a busy collector collects by itself; the
// relief's own collection counts as none, since what is live keeps
// changing while the collector drains), at most once every reliefEvery,
// and then cheaply: the collector is idle. Checking every frame rather
// than once a second ends an Open whose clients have all been refused
// within a frame or two of the collector going quiet: the OTLP exporters
// wait seconds after a refusal, and an Open held on stale figures left the
// collector idle while their queues were full. It reports whether it
// collected.
//
// It never returns memory to the kernel (debug.FreeOSMemory): memory the
// runtime has freed beyond what the heap grows back into is not counted in
// the level, since the heap reuses it before it asks for more, and a forced
// full scavenge every second at the memory edge took the CPU the collector
// needed to drain what it held.
func (r *Relief) Relieve() bool {
	n := r.gcCycles()
	quiet := n == r.lastSeen
	r.lastSeen = n
	if !quiet || (!r.lastForced.IsZero() && r.now().Sub(r.lastForced) < reliefEvery) {
		return false
	}
	r.gc()
	r.lastForced = r.now()
	r.lastSeen = r.gcCycles()
	return true
}

// gcCycles is the number of completed collections.
func (r *Relief) gcCycles() uint64 {
	metrics.Read(r.cycles)
	if r.cycles[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return r.cycles[0].Value.Uint64()
}

// The runtime/metrics read by HeapView, in this order.
var heapMetrics = []string{
	"/gc/heap/live:bytes",
	"/gc/heap/goal:bytes",
	"/gc/gogc:percent",
	"/gc/scan/stack:bytes",
	"/gc/scan/globals:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
}

// HeapView reads the runtime's heap figures. Not safe for concurrent use:
// the sampler's goroutine owns one.
type HeapView struct {
	samples []metrics.Sample
	// gcPercent, when it owns GOGC, makes the held-back heap count
	// against GOGC's default rather than the raised GC percent.
	gcPercent *GCPercent
	last      HeapFigures
}

// HeapFigures are the figures of the last collection the GC paces by
// (Live, Stacks, Globals), and the heap's memory now: Objects, what its
// objects occupy, live or not yet collected, and Free, what it has freed and
// not returned.
type HeapFigures struct {
	Live, Stacks, Globals uint64
	Objects, Free         uint64
}

// NewHeapView returns a HeapView; gcPercent may be nil.
func NewHeapView(gcPercent *GCPercent) *HeapView {
	v := &HeapView{samples: make([]metrics.Sample, len(heapMetrics)), gcPercent: gcPercent}
	for i, n := range heapMetrics {
		v.samples[i].Name = n
	}
	return v
}

// Last returns the figures of the last Read; none on nil.
func (v *HeapView) Last() HeapFigures {
	if v == nil {
		return HeapFigures{}
	}
	return v.last
}

// Read returns two corrections of the working set, in bytes.
//
// spare is heap memory the runtime has freed and not yet returned to the
// kernel, less what the heap fills before its next collection (its goal
// less what its objects occupy): it is resident, so the working set counts
// it, but the heap reuses it before it asks the kernel for more, so it is no
// step towards the OOM killer. What the heap grows into before the GC runs is
// no spare room, or the level would follow the phase of the GC's cycle
// rather than what the heap is about to hold.
//
// heldBack is how far the heap goal is below the one the GC would set at
// its configured GC percent (GOGC) for what is live: 0 while no soft memory
// limit binds, and growing as the limit squeezes the heap, that is as the
// GC has to run more often to keep under it. GOGC=off, and a GC percent the
// throttle raised (GCPercent), count as GOGC's default, the one the memory
// lines are drawn for.
func (v *HeapView) Read() (spare, heldBack uint64) {
	metrics.Read(v.samples)
	var u [7]uint64
	for i, s := range v.samples {
		if s.Value.Kind() != metrics.KindUint64 {
			return 0, 0
		}
		u[i] = s.Value.Uint64()
	}
	v.last = HeapFigures{Live: u[0], Stacks: u[3], Globals: u[4], Free: u[5], Objects: u[6]}
	gogc := u[2]
	if v.gcPercent.Owned() {
		gogc = defaultGCPercent
	}
	return spareBytes(u[5], u[1], u[6]), heldBackBytes(u[0], u[1], gogc, u[3], u[4])
}

// spareBytes is the free heap memory beyond what the heap's objects grow
// into before the GC's next collection, at its goal.
func spareBytes(free, goal, objects uint64) uint64 {
	fill := goal - min(goal, objects)
	return free - min(free, fill)
}

// heldBackBytes is Read's arithmetic: the GC's pacing goal for live bytes
// is live + (live + stacks + globals) × GOGC/100.
func heldBackBytes(live, goal, gogc, stacks, globals uint64) uint64 {
	if gogc > math.MaxInt32 { // GOGC=off reads as a huge percentage
		gogc = defaultGCPercent
	}
	natural := float64(live) + float64(live+stacks+globals)*float64(gogc)/100
	if natural <= float64(goal) {
		return 0
	}
	return uint64(natural - float64(goal))
}
