// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/csv"
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
		fl.agAccepted += zero(get(s, "otelcol_receiver_accepted_spans", nil))
		fl.agRefused += zero(get(s, "otelcol_receiver_refused_spans", nil))
		fl.agSent += zero(get(s, "otelcol_exporter_sent_spans", nil))
		fl.agSendFailed += zero(get(s, "otelcol_exporter_send_failed_spans", nil))
		fl.agEnqueueFailed += zero(get(s, "otelcol_exporter_enqueue_failed_spans", nil))
		fl.agQueue += zero(get(s, "otelcol_exporter_queue_size", nil))
	}
	if ss, _ := fr.sink.scr.Get(); ss != nil {
		fr.last[len(fr.agents)] = ss
	}
	fl.sinkSpans = zero(get(fr.last[len(fr.agents)], "otelcol_receiver_accepted_spans", nil))
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
		l.base = addCounts(l.base, old.Snapshot().Total)
	}
	l.runners = rs
}

// total is the counts so far.
func (l *loadCounts) total() loadgen.Counts {
	l.mu.Lock()
	runners, c := l.runners, l.base
	l.mu.Unlock()
	for _, rn := range runners {
		c = addCounts(c, rn.Snapshot().Total)
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

// point is what the summary and the drain need of one row.
type point struct {
	flow
	t        time.Duration
	phase    string
	alive    bool
	restarts int
	cg       harness.CgStats
	cgOK     bool
	wsPct    float64
	cpuPct   float64 // < 0: unknown
	hostPct  float64 // the machine's, all cores; < 0: unknown
	state    float64 // NaN: unknown or no throttle
	lg       loadgen.Counts
}

type recorder struct {
	loadCounts
	scenario string
	o        options
	f        *fleet
	w        *csv.Writer
	start    time.Time
	flows    *flowReader

	mu     sync.Mutex
	phase  string
	points []point
}

func newRecorder(scenario string, o options, f *fleet, w *csv.Writer) *recorder {
	return &recorder{scenario: scenario, o: o, f: f, w: w, start: time.Now(), flows: newFlowReader(f.agents, f.sink)}
}

func (r *recorder) setPhase(p string) {
	r.mu.Lock()
	r.phase = p
	r.mu.Unlock()
}

func addCounts(a, b loadgen.Counts) loadgen.Counts {
	a.Sent += b.Sent
	a.OK += b.OK
	a.Rejected += b.Rejected
	a.Unavailable += b.Unavailable
	a.Other += b.Other
	a.Errors += b.Errors
	a.Skipped += b.Skipped
	a.SentItems += b.SentItems
	a.AcceptedItems += b.AcceptedItems
	a.SentBytes += b.SentBytes
	return a
}

// latest returns the last recorded point.
func (r *recorder) latest() (point, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.points) == 0 {
		return point{}, false
	}
	return r.points[len(r.points)-1], true
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

func (r *recorder) snapshot() []point {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]point(nil), r.points...)
}

func (r *recorder) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var prevCPU time.Duration
	var prevAt time.Time
	var prevHost harness.HostCPU
	for {
		now := time.Now()
		r.sample(now, &prevCPU, &prevAt, &prevHost)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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

// get sums the series name (with labels want) of samples; NaN when absent.
func get(samples []harness.Sample, name string, want map[string]string) float64 {
	v, ok := harness.Sum(samples, name, want)
	if !ok {
		return math.NaN()
	}
	return v
}

func (r *recorder) sample(now time.Time, prevCPU *time.Duration, prevAt *time.Time, prevHost *harness.HostCPU) {
	p := point{t: now.Sub(r.start), cpuPct: -1, hostPct: -1, state: math.NaN()}
	// The machine's CPU: the agents, the sink and the generator share its
	// cores with the gateway, and a burst can take all of them.
	if h, err := harness.ReadHostCPU("/proc/stat"); err == nil {
		if prevHost.Total > 0 {
			p.hostPct = h.BusyPct(*prevHost)
		}
		*prevHost = h
	}
	r.mu.Lock()
	p.phase = r.phase
	r.mu.Unlock()
	p.lg = r.total()

	_, alive, restarts := r.f.gateway.proc.State()
	p.alive, p.restarts = alive, restarts
	st, err := r.f.cg.Stats()
	p.cg, p.cgOK = st, err == nil
	if p.cgOK && st.Limit > 0 {
		p.wsPct = 100 * float64(st.WorkingSet) / float64(st.Limit)
	}
	if p.cgOK && !prevAt.IsZero() {
		p.cpuPct = 100 * (st.CPUUsage - *prevCPU).Seconds() / (now.Sub(*prevAt).Seconds() * r.o.cpus)
	}
	if p.cgOK {
		*prevCPU, *prevAt = st.CPUUsage, now
	}
	row := []string{
		r.scenario, f64(p.t.Seconds(), 3), strconv.FormatInt(now.UnixMilli(), 10), p.phase,
		b2s(alive), strconv.Itoa(restarts),
	}
	if p.cgOK {
		row = append(row, strconv.FormatUint(st.OOMKills, 10), strconv.FormatUint(st.WorkingSet, 10), strconv.FormatUint(st.Limit, 10),
			f64(p.wsPct, 2), f64(st.CPUUsage.Seconds(), 3))
		if p.cpuPct >= 0 {
			row = append(row, f64(p.cpuPct, 1))
		} else {
			row = append(row, "")
		}
	} else {
		row = append(row, "", "", "", "", "", "")
	}

	// The gateway: only a fresh scrape of a live process.
	gs, at := r.f.gateway.scr.Get()
	fresh := alive && !at.IsZero() && now.Sub(at) < time.Second
	g := func(name string, labels map[string]string) float64 {
		if !fresh {
			return math.NaN()
		}
		return get(gs, name, labels)
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
		opt(lvl("cpu_enter"), 2), opt(lvl("mem_enter"), 2), opt(lvl("mem_hard"), 2),
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

	p.flow = r.flows.read(now)
	row = append(row, p.flowRow()...)
	row = append(row, loadRow(p.lg)...)
	if p.hostPct >= 0 {
		row = append(row, f64(p.hostPct, 1))
	} else {
		row = append(row, "")
	}

	r.mu.Lock()
	r.points = append(r.points, p)
	_ = r.w.Write(row)
	r.w.Flush()
	r.mu.Unlock()
}

// zero is v, or 0 for a missing value: an agent's counter that was never
// incremented is not exported at all.
func zero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}
