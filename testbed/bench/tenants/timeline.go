// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// point is one sample of a round: the machine, the gateway (its process,
// its cgroup, its own metrics) and the tenants' counts at the sink and at
// their taps.
type point struct {
	at      time.Time
	hostPct float64 // the machine's CPU busy since the last sample, % of all cores; < 0: unknown
	alive   bool
	restart int
	cg      harness.CgStats
	cgOK    bool
	cpuPct  float64 // the gateway's CPU since the last sample, % of its quota; < 0: unknown
	// The throttle's state of traces (0 Normal, 1 Shedding, 2 Open) and
	// its in-flight bytes reserved and budget; NaN: no throttle or no
	// fresh scrape.
	state, reserved, budget float64
	sink                    map[string]int64
}

// recorder samples a round every interval into its points and the
// timeline.
type recorder struct {
	r *round
	w *harness.CSVFile

	// the sampling goroutine's
	prevHost harness.HostCPU
	prevCPU  time.Duration
	prevAt   time.Time

	mu     sync.Mutex
	phase  string
	points []point
}

func newRecorder(r *round, w *harness.CSVFile) *recorder {
	return &recorder{r: r, w: w, phase: "start"}
}

func (rec *recorder) setPhase(p string) {
	rec.mu.Lock()
	rec.phase = p
	rec.mu.Unlock()
}

func (rec *recorder) snapshot() []point {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.points)
}

// timelineHeader names the timeline's columns, the tenants' last:
// sink_<tenant> is the spans the sink counted of the tenant, ok_<tenant>
// and refused_<tenant> the exports its tap saw accepted and refused, all
// cumulative over the round. gw_* are the gateway's: its cgroup, and its
// own metrics (empty while its scrape is older than 1 s; its counters
// restart with it). An empty cell is a missing value: plot it as a gap.
func timelineHeader(tenants int) []string {
	h := []string{
		"round", "topology", "gateway", "kind", "t_s", "unix_ms", "phase", "host_busy_pct",
		"gw_alive", "gw_restarts", "gw_oom_kills", "gw_ws_bytes", "gw_limit_bytes", "gw_cpu_pct",
		"gw_state", "gw_wl_cpu_slow", "gw_wl_memory", "gw_inflight_reserved", "gw_inflight_limit", "gw_held",
		"gw_allowed", "gw_denied_shed", "gw_denied_open", "gw_denied_budget",
		"gw_accepted_spans", "gw_refused_spans", "gw_queue_size",
	}
	for i := range tenants {
		n := tenantName(i)
		h = append(h, "sink_"+n, "ok_"+n, "refused_"+n)
	}
	return h
}

func (rec *recorder) sample() {
	r, now := rec.r, time.Now()
	p := point{at: now, hostPct: -1, cpuPct: -1, state: math.NaN(), reserved: math.NaN(), budget: math.NaN()}
	if h, err := harness.ReadHostCPU("/proc/stat"); err == nil {
		if rec.prevHost.Total > 0 {
			p.hostPct = h.BusyPct(rec.prevHost)
		}
		rec.prevHost = h
	}
	_, p.alive, p.restart = r.gw.Proc.State()
	p.cg, p.cgOK = func() (harness.CgStats, bool) { s, err := r.cg.Stats(); return s, err == nil }()
	if p.cgOK {
		if !rec.prevAt.IsZero() {
			p.cpuPct = 100 * (p.cg.CPUUsage - rec.prevCPU).Seconds() / (now.Sub(rec.prevAt).Seconds() * r.o.cpus)
		}
		rec.prevCPU, rec.prevAt = p.cg.CPUUsage, now
	}
	gs, at := r.gw.Scraper.Get()
	fresh := p.alive && !at.IsZero() && now.Sub(at) < time.Second
	g := func(name string, labels map[string]string) float64 {
		if !fresh {
			return math.NaN()
		}
		return harness.Value(gs, name, labels)
	}
	p.state = g("otelcol_throttle_state", map[string]string{"signal": "traces"})
	p.reserved = g("otelcol_throttle_inflight_bytes", map[string]string{"budget": "reserved"})
	p.budget = g("otelcol_throttle_inflight_bytes", map[string]string{"budget": "limit"})
	p.sink = r.sink.snapshot()

	rec.mu.Lock()
	phase := rec.phase
	rec.mu.Unlock()
	spec := r.spec
	row := []string{
		spec.name(), spec.pair.topology, spec.pair.gw.name, spec.round,
		f64(now.Sub(r.t0).Seconds(), 3), strconv.FormatInt(now.UnixMilli(), 10), phase, opt(nonNeg(p.hostPct), 1),
		b2s(p.alive), strconv.Itoa(p.restart),
	}
	if p.cgOK {
		row = append(row, strconv.FormatUint(p.cg.OOMKills, 10), strconv.FormatUint(p.cg.WorkingSet, 10), strconv.FormatUint(p.cg.Limit, 10), opt(nonNeg(p.cpuPct), 1))
	} else {
		row = append(row, "", "", "", "")
	}
	reason := func(v string) map[string]string { return map[string]string{"decision": "denied", "reason": v} }
	row = append(row,
		opt(p.state, 0),
		opt(g("otelcol_throttle_water_level", map[string]string{"kind": "cpu_slow"}), 4),
		opt(g("otelcol_throttle_water_level", map[string]string{"kind": "memory"}), 4),
		opt(p.reserved, 0), opt(p.budget, 0), opt(g("otelcol_throttle_held_requests", nil), 0),
		opt(g("otelcol_throttle_requests", map[string]string{"decision": "allowed"}), 0),
		opt(g("otelcol_throttle_requests", reason("shed")), 0),
		opt(g("otelcol_throttle_requests", reason("open")), 0),
		opt(g("otelcol_throttle_requests", reason("budget")), 0),
		opt(g("otelcol_receiver_accepted_spans", nil), 0),
		opt(g("otelcol_receiver_refused_spans", nil), 0),
		opt(g("otelcol_exporter_queue_size", nil), 0),
	)
	ok, refused := map[int]int{}, map[int]int{}
	for _, m := range r.members {
		ok[m.i], refused[m.i] = m.tap.counts()
	}
	for i := range spec.rates {
		if spec.rates[i] <= 0 {
			row = append(row, "", "", "")
			continue
		}
		row = append(row, strconv.FormatInt(p.sink[tenantName(i)], 10), strconv.Itoa(ok[i]), strconv.Itoa(refused[i]))
	}
	rec.mu.Lock()
	rec.points = append(rec.points, p)
	rec.w.Write(row)
	rec.mu.Unlock()
	_ = rec.w.Flush()
}

func f64(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

// opt formats v, "" when it is missing (NaN).
func opt(v float64, prec int) string {
	if math.IsNaN(v) {
		return ""
	}
	return f64(v, prec)
}

// nonNeg is v, or NaN when it is negative (unknown).
func nonNeg(v float64) float64 {
	if v < 0 {
		return math.NaN()
	}
	return v
}

func b2s(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
