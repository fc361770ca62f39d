// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// timelineHeader is the header of timeline.csv: one row every interval per
// scenario. gw_* are the gateway (its cgroup, and its own metrics: empty
// while it is down or its scrape is older than 1 s; its counters restart
// with it), ag_* the agents' metrics summed (their last scrape: agents are
// never restarted, so their counters only grow), sink_* the sink's, lg_*
// the load generators' summed (cumulative over the scenario's phases).
// gw_wl_* are the throttle's levels: the memory level the lines apply to,
// the working set it starts from and its two heap corrections (mem = mem_ws
// - heap_spare + heap_held_back, shares of the limit). An
// empty cell is a missing value: plot it as a gap, never as 0.
var timelineHeader = slices.Concat([]string{
	"scenario", "t_s", "unix_ms", "phase",
	"gw_alive", "gw_restarts", "gw_oom_kills", "gw_ws_bytes", "gw_limit_bytes", "gw_ws_pct", "gw_cpu_s", "gw_cpu_pct",
	"gw_scrape_age_ms", "gw_state_traces", "gw_wl_cpu_slow", "gw_wl_cpu_fast", "gw_wl_mem",
	"gw_wl_mem_ws", "gw_wl_heap_spare", "gw_wl_heap_held_back", "gw_gc_percent", "gw_go_memory_limit_bytes",
	"gw_cpu_enter", "gw_mem_enter", "gw_mem_hard", "gw_inflight_reserved", "gw_inflight_limit",
	"gw_thr_allowed", "gw_thr_denied_shed", "gw_thr_denied_open", "gw_thr_denied_budget",
	"gw_accepted_spans", "gw_refused_spans", "gw_sent_spans", "gw_send_failed_spans", "gw_enqueue_failed_spans",
	"gw_queue_size", "gw_heap_alloc_bytes",
}, flowHeader, loadHeader, []string{"host_cpu_pct"})

// flow is what the agents and the sink have counted, in spans: the
// agents' metrics summed (their last good scrape each: agents are never
// restarted, so their counters only grow) and the sink's. The accounting
// and the drain of the fleet and of the tier read it.
type flow struct {
	// agentsFresh is the number of agents scraped within the last 2 s.
	agentsFresh                                                           int
	agAccepted, agRefused, agSent, agSendFailed, agEnqueueFailed, agQueue float64
	sinkSpans                                                             float64
}

// flowReader reads the flow, keeping the last good scrape of each agent
// and of the sink: a late scrape keeps it.
type flowReader struct {
	agents []*member
	sink   *member
	last   [][]harness.Sample // per agent, then the sink's
}

func newFlowReader(agents []*member, sink *member) *flowReader {
	return &flowReader{agents: agents, sink: sink, last: make([][]harness.Sample, len(agents)+1)}
}

func (fr *flowReader) read(now time.Time) flow {
	var fl flow
	for i, a := range fr.agents {
		s, at := a.scr.Get()
		if !at.IsZero() && now.Sub(at) < 2*time.Second {
			fl.agentsFresh++
		}
		if s != nil {
			fr.last[i] = s
		}
		s = fr.last[i]
		fl.agAccepted += zero(harness.Value(s, "otelcol_receiver_accepted_spans", nil))
		fl.agRefused += zero(harness.Value(s, "otelcol_receiver_refused_spans", nil))
		fl.agSent += zero(harness.Value(s, "otelcol_exporter_sent_spans", nil))
		fl.agSendFailed += zero(harness.Value(s, "otelcol_exporter_send_failed_spans", nil))
		fl.agEnqueueFailed += zero(harness.Value(s, "otelcol_exporter_enqueue_failed_spans", nil))
		fl.agQueue += zero(harness.Value(s, "otelcol_exporter_queue_size", nil))
	}
	if ss, _ := fr.sink.scr.Get(); ss != nil {
		fr.last[len(fr.agents)] = ss
	}
	fl.sinkSpans = zero(harness.Value(fr.last[len(fr.agents)], "otelcol_receiver_accepted_spans", nil))
	return fl
}

// flowRow is the flow's cells of a timeline: ag_fresh to
// sink_accepted_spans.
func (fl flow) flowRow() []string {
	return []string{
		strconv.Itoa(fl.agentsFresh), f64(fl.agAccepted, 0), f64(fl.agRefused, 0), f64(fl.agSent, 0),
		f64(fl.agSendFailed, 0), f64(fl.agEnqueueFailed, 0), f64(fl.agQueue, 0), f64(fl.sinkSpans, 0),
	}
}

// flowHeader names flowRow's cells.
var flowHeader = []string{
	"ag_fresh", "ag_accepted_spans", "ag_refused_spans", "ag_sent_spans", "ag_send_failed_spans", "ag_enqueue_failed_spans", "ag_queue_size",
	"sink_accepted_spans",
}

// loadCounts sums the load generators' counts over a scenario: each load
// call starts new runners, whose counts start at 0.
type loadCounts struct {
	mu      sync.Mutex
	runners []*loadgen.Runner
	// base: the counts of the scenario's earlier runners.
	base loadgen.Counts
}

func (l *loadCounts) setRunners(rs []*loadgen.Runner) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, old := range l.runners {
		l.base.Add(old.Snapshot().Total)
	}
	l.runners = rs
}

// total is the counts so far.
func (l *loadCounts) total() loadgen.Counts {
	l.mu.Lock()
	runners, c := l.runners, l.base
	l.mu.Unlock()
	for _, rn := range runners {
		c.Add(rn.Snapshot().Total)
	}
	return c
}

// loadRow is the cells lg_sent to lg_accepted_items of a timeline.
func loadRow(lg loadgen.Counts) []string {
	return []string{
		strconv.FormatInt(lg.Sent, 10), strconv.FormatInt(lg.OK, 10),
		strconv.FormatInt(lg.Rejected+lg.Unavailable+lg.Other+lg.Errors, 10), strconv.FormatInt(lg.Skipped, 10),
		strconv.FormatInt(lg.AcceptedItems, 10),
	}
}

// loadHeader names loadRow's cells.
var loadHeader = []string{"lg_sent", "lg_ok", "lg_failed", "lg_skipped", "lg_accepted_items"}

// basePoint is what every point of the fleet's and the tier's timelines
// has: its time since the recording started, the phase, the machine's CPU
// busy over the last interval (all cores; < 0: unknown), the load
// generators' counts and the agents' and the sink's flow.
type basePoint struct {
	flow
	t       time.Duration
	phase   string
	hostPct float64
	lg      loadgen.Counts
}

// flowOf is the point's flow.
func (b basePoint) flowOf() flow { return b.flow }

// at is the point's time since the recording started.
func (b basePoint) at() time.Duration { return b.t }

// timeline is what the fleet's and the tier's recorders share: the load
// generators' counts, the flow of the agents and the sink, the phase and
// the points recorded so far.
type timeline[P interface{ flowOf() flow }] struct {
	loadCounts
	start time.Time
	flows *flowReader
	// prevHost: the machine's CPU at the previous point (the sampling
	// goroutine's).
	prevHost harness.HostCPU

	mu     sync.Mutex
	phase  string
	points []P
}

func newTimeline[P interface{ flowOf() flow }](agents []*member, sink *member) timeline[P] {
	return timeline[P]{start: time.Now(), flows: newFlowReader(agents, sink)}
}

func (tl *timeline[P]) setPhase(p string) {
	tl.mu.Lock()
	tl.phase = p
	tl.mu.Unlock()
}

// latest returns the last recorded point.
func (tl *timeline[P]) latest() (P, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if len(tl.points) == 0 {
		var none P
		return none, false
	}
	return tl.points[len(tl.points)-1], true
}

// latestFlow is the flow of the last recorded point.
func (tl *timeline[P]) latestFlow() (flow, bool) {
	p, ok := tl.latest()
	return p.flowOf(), ok
}

// counts is where the load generators' counts go.
func (tl *timeline[P]) counts() *loadCounts { return &tl.loadCounts }

func (tl *timeline[P]) snapshot() []P {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]P(nil), tl.points...)
}

// begin starts the point of now; its flow is read by end.
func (tl *timeline[P]) begin(now time.Time) basePoint {
	b := basePoint{t: now.Sub(tl.start), hostPct: -1}
	// The machine's CPU: the agents, the sink and the generator share its
	// cores with the gateways, and a burst can take all of them.
	if h, err := harness.ReadHostCPU("/proc/stat"); err == nil {
		if tl.prevHost.Total > 0 {
			b.hostPct = h.BusyPct(tl.prevHost)
		}
		tl.prevHost = h
	}
	tl.mu.Lock()
	b.phase = tl.phase
	tl.mu.Unlock()
	b.lg = tl.total()
	return b
}

// end reads the point's flow: after the gateways, so that the sink has
// counted what they had sent.
func (tl *timeline[P]) end(now time.Time, b *basePoint) {
	b.flow = tl.flows.read(now)
}

// add records p; write writes its rows under the same lock, so that the
// rows are in the points' order.
func (tl *timeline[P]) add(p P, write func()) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.points = append(tl.points, p)
	write()
}

// procPoint is a gateway at one point: its process and its cgroup.
type procPoint struct {
	alive    bool
	restarts int
	cg       harness.CgStats
	cgOK     bool
	wsPct    float64
	cpuPct   float64 // of its quota over the last interval; < 0: unknown
}

// cpuMark is a gateway's CPU time at the previous point.
type cpuMark struct {
	used time.Duration
	at   time.Time
}

// procHeader names readProc's cells.
var procHeader = []string{"alive", "restarts", "oom_kills", "ws_bytes", "limit_bytes", "ws_pct", "cpu_s", "cpu_pct"}

// readProc reads a gateway of cpus cores, its process and its cgroup, at
// now (prev: its CPU time at the previous point), and returns it and its
// cells of a timeline row (procHeader).
func readProc(now time.Time, proc *harness.Process, cg *harness.Cgroup, cpus float64, prev *cpuMark) (procPoint, []string) {
	pp := procPoint{cpuPct: -1}
	if proc != nil { // nil: not started yet
		_, pp.alive, pp.restarts = proc.State()
	}
	row := []string{b2s(pp.alive), strconv.Itoa(pp.restarts)}
	st, err := cg.Stats()
	pp.cg, pp.cgOK = st, err == nil
	if !pp.cgOK {
		return pp, append(row, "", "", "", "", "", "")
	}
	if st.Limit > 0 {
		pp.wsPct = 100 * float64(st.WorkingSet) / float64(st.Limit)
	}
	if !prev.at.IsZero() {
		pp.cpuPct = 100 * (st.CPUUsage - prev.used).Seconds() / (now.Sub(prev.at).Seconds() * cpus)
	}
	*prev = cpuMark{used: st.CPUUsage, at: now}
	return pp, append(row, strconv.FormatUint(st.OOMKills, 10), strconv.FormatUint(st.WorkingSet, 10), strconv.FormatUint(st.Limit, 10),
		f64(pp.wsPct, 2), f64(st.CPUUsage.Seconds(), 3), opt(nonNeg(pp.cpuPct), 1))
}

// point is what the summary and the drain need of one row.
type point struct {
	basePoint
	procPoint
	state float64 // NaN: unknown or no throttle
	gw    gatewayCounts
}

// gatewayCounts are a gateway's own counters at a point (NaN: no fresh
// scrape; they restart with it): spans its receiver refused after
// decoding, spans its exporter could not queue, requests the throttle
// refused before reading them.
type gatewayCounts struct {
	refused, enqueueFailed, denied float64
}

type recorder struct {
	timeline[point]
	scenario string
	o        options
	f        *fleet
	w        *harness.CSVFile
	prevCPU  cpuMark // the sampling goroutine's
}

func newRecorder(scenario string, o options, f *fleet, w *harness.CSVFile) *recorder {
	return &recorder{timeline: newTimeline[point](f.agents, f.sink), scenario: scenario, o: o, f: f, w: w}
}

// sinkRate is the sink's rate in spans/s between from and to, from the
// points recorded in that window (0 without two of them).
func (r *recorder) sinkRate(from, to time.Time) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first, last *point
	for i := range r.points {
		at := r.start.Add(r.points[i].t)
		if at.Before(from) || at.After(to) {
			continue
		}
		if first == nil {
			first = &r.points[i]
		}
		last = &r.points[i]
	}
	if first == nil || last == first {
		return 0
	}
	return (last.sinkSpans - first.sinkSpans) / (last.t - first.t).Seconds()
}

func (r *recorder) run(ctx context.Context, interval time.Duration) {
	harness.Every(ctx, interval, func() { r.sample(time.Now()) })
}

func f64(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

func opt(v float64, prec int) string {
	if math.IsNaN(v) {
		return ""
	}
	return f64(v, prec)
}

func b2s(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func (r *recorder) sample(now time.Time) {
	p := point{basePoint: r.begin(now), state: math.NaN()}
	var proc []string
	p.procPoint, proc = readProc(now, r.f.gateway.proc, r.f.cg, r.o.cpus, &r.prevCPU)
	row := slices.Concat([]string{r.scenario, f64(p.t.Seconds(), 3), strconv.FormatInt(now.UnixMilli(), 10), p.phase}, proc)

	// The gateway: only a fresh scrape of a live process.
	gs, at := r.f.gateway.scr.Get()
	fresh := p.alive && !at.IsZero() && now.Sub(at) < time.Second
	g := func(name string, labels map[string]string) float64 {
		if !fresh {
			return math.NaN()
		}
		return harness.Value(gs, name, labels)
	}
	if fresh {
		row = append(row, strconv.FormatInt(now.Sub(at).Milliseconds(), 10))
	} else {
		row = append(row, "")
	}
	p.state = g("otelcol_throttle_state", map[string]string{"signal": "traces"})
	lvl := func(kind string) float64 { return g("otelcol_throttle_water_level", map[string]string{"kind": kind}) }
	row = append(row, opt(p.state, 0), opt(lvl("cpu_slow"), 4), opt(lvl("cpu_fast"), 4), opt(lvl("memory"), 4),
		opt(lvl("memory_working_set"), 4), opt(lvl("memory_heap_spare"), 4), opt(lvl("memory_heap_held_back"), 4),
		opt(g("otelcol_throttle_gc_percent", nil), 0), opt(g("otelcol_throttle_go_memory_limit", nil), 0),
		opt(lvl("cpu_enter"), 2), opt(lvl("memory_enter"), 2), opt(lvl("memory_hard"), 2),
		opt(g("otelcol_throttle_inflight_bytes", map[string]string{"budget": "reserved"}), 0),
		opt(g("otelcol_throttle_inflight_bytes", map[string]string{"budget": "limit"}), 0),
		opt(g("otelcol_throttle_requests", map[string]string{"decision": "allowed"}), 0),
		opt(g("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "shed"}), 0),
		opt(g("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "open"}), 0),
		opt(g("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "budget"}), 0),
		opt(g("otelcol_receiver_accepted_spans", nil), 0),
		opt(g("otelcol_receiver_refused_spans", nil), 0),
		opt(g("otelcol_exporter_sent_spans", nil), 0),
		opt(g("otelcol_exporter_send_failed_spans", nil), 0),
		opt(g("otelcol_exporter_enqueue_failed_spans", nil), 0),
		opt(g("otelcol_exporter_queue_size", nil), 0),
		opt(g("otelcol_process_runtime_heap_alloc_bytes", nil), 0),
	)

	p.gw = gatewayCounts{
		refused:       g("otelcol_receiver_refused_spans", nil),
		enqueueFailed: g("otelcol_exporter_enqueue_failed_spans", nil),
		denied:        g("otelcol_throttle_requests", map[string]string{"decision": "denied"}),
	}
	r.end(now, &p.basePoint)
	row = slices.Concat(row, p.flowRow(), loadRow(p.lg), []string{opt(nonNeg(p.hostPct), 1)})
	r.add(p, func() {
		r.w.Write(row)
		_ = r.w.Flush()
	})
}

// zero is v, or 0 for a missing value: an agent's counter that was never
// incremented is not exported at all.
func zero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}
