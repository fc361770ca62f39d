// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
)

// point is one sample of the timeline.
type point struct {
	t      float64 // seconds since the gateway started
	phase  string
	stress bool // a memory pulse or the CPU load runs
	// The gateway: alive, restarts, its cgroup and its metrics (NaN
	// without a fresh scrape).
	alive                        bool
	restarts                     int
	oomKills                     float64
	wsPct, cpuPct                float64
	state, openDuration          float64
	cpuSlow, cpuFast, mem        float64
	cpuEnter, cpuHard            float64
	memEnter, memHard            float64
	shed, open, budget, allowed  float64
	cutOff                       float64 // admitted, then cut off
	held, reserved, budgetLimit  float64
	gwAccepted, gwSent, gwQueue  float64
	sinkTotal                    float64
	arrived                      []float64 // per client, in the scenario's order
	agentSendFailed, agentQueued float64
}

// timelineHeader is the header of timeline.csv; the clients' arrival
// columns follow (arrived_<client>).
var timelineHeader = []string{
	"t_s", "phase", "stress", "gw_alive", "gw_restarts", "oom_kills", "ws_pct", "cpu_pct",
	"state_traces", "open_duration_s", "wl_cpu_slow", "wl_cpu_fast", "wl_memory",
	"cpu_enter", "cpu_hard", "memory_enter", "memory_hard",
	"allowed", "denied_shed", "denied_open", "denied_budget", "held_requests", "inflight_reserved", "inflight_limit",
	"gw_accepted_spans", "gw_sent_spans", "gw_queue_size", "sink_spans", "agents_send_failed_spans", "agents_queue_size",
}

// recorder samples the gateway, the agents and the sink every interval
// into timeline.csv and keeps the points for the report.
type recorder struct {
	m     *matrix
	start time.Time
	w     *harness.CSVFile // nil: timeline.csv could not be created

	mu     sync.Mutex
	phase  string
	stress bool
	points []point
}

func newRecorder(m *matrix) *recorder {
	r := &recorder{m: m, start: time.Now(), phase: "start"}
	header := append([]string(nil), timelineHeader...)
	for _, c := range m.s.clients {
		header = append(header, "arrived_"+c.name())
	}
	w, err := harness.CreateCSV(m.path("timeline.csv"), header)
	if err != nil {
		logf("timeline: %v", err)
		return r
	}
	r.w = w
	return r
}

func (r *recorder) setPhase(p string) {
	r.mu.Lock()
	r.phase = p
	r.mu.Unlock()
}

func (r *recorder) setStress(on bool) {
	r.mu.Lock()
	r.stress = on
	r.mu.Unlock()
}

// snapshot returns the points so far.
func (r *recorder) snapshot() []point {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]point(nil), r.points...)
}

func (r *recorder) run(ctx context.Context) {
	defer func() {
		if r.w != nil {
			_ = r.w.Close()
		}
	}()
	t := time.NewTicker(r.m.o.interval)
	defer t.Stop()
	var prevCPU time.Duration
	var prevAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.sample(now, &prevCPU, &prevAt)
		}
	}
}

func (r *recorder) sample(now time.Time, prevCPU *time.Duration, prevAt *time.Time) {
	r.mu.Lock()
	p := point{t: now.Sub(r.start).Seconds(), phase: r.phase, stress: r.stress}
	r.mu.Unlock()
	m := r.m
	_, p.alive, p.restarts = m.gw.Proc.State()
	p.wsPct, p.cpuPct, p.oomKills = math.NaN(), math.NaN(), math.NaN()
	if st, err := m.cg.Stats(); err == nil {
		p.oomKills = float64(st.OOMKills)
		if st.Limit > 0 {
			p.wsPct = 100 * float64(st.WorkingSet) / float64(st.Limit)
		}
		if !prevAt.IsZero() {
			p.cpuPct = 100 * (st.CPUUsage - *prevCPU).Seconds() / (now.Sub(*prevAt).Seconds() * m.o.cpus)
		}
		*prevCPU, *prevAt = st.CPUUsage, now
	}
	gs, at := m.gw.Scraper.Get()
	fresh := p.alive && !at.IsZero() && now.Sub(at) < time.Second
	g := func(name string, labels map[string]string) float64 {
		if !fresh {
			return math.NaN()
		}
		return harness.Value(gs, name, labels)
	}
	// The water level's kinds under today's names, or the old ones.
	lvl := func(kinds ...string) float64 {
		for _, k := range kinds {
			if v := g("otelcol_throttle_water_level", map[string]string{"kind": k}); !math.IsNaN(v) {
				return v
			}
		}
		return math.NaN()
	}
	p.state = g("otelcol_throttle_state", map[string]string{"signal": "traces"})
	p.openDuration = g("otelcol_throttle_open_duration", nil)
	p.cpuSlow, p.cpuFast, p.mem = lvl("cpu_slow"), lvl("cpu_fast"), lvl("memory", "mem")
	p.cpuEnter, p.cpuHard = lvl("cpu_enter"), lvl("cpu_hard")
	p.memEnter, p.memHard = lvl("memory_enter", "mem_enter"), lvl("memory_hard", "mem_hard")
	p.allowed = g("otelcol_throttle_requests", map[string]string{"signal": "traces", "decision": "allowed"})
	denied := func(reason string) float64 {
		return zero(g("otelcol_throttle_requests", map[string]string{"signal": "traces", "decision": "denied", "reason": reason}))
	}
	p.shed, p.open, p.budget = denied("shed"), denied("open"), denied("budget")
	p.cutOff = zero(g("otelcol_throttle_cut_off_requests", map[string]string{"signal": "traces"}))
	if !fresh {
		p.shed, p.open, p.budget, p.cutOff = math.NaN(), math.NaN(), math.NaN(), math.NaN()
	}
	p.held = g("otelcol_throttle_held_requests", nil)
	p.reserved = g("otelcol_throttle_inflight_bytes", map[string]string{"budget": "reserved"})
	p.budgetLimit = g("otelcol_throttle_inflight_bytes", map[string]string{"budget": "limit"})
	p.gwAccepted = g("otelcol_receiver_accepted_spans", nil)
	p.gwSent = g("otelcol_exporter_sent_spans", nil)
	p.gwQueue = g("otelcol_exporter_queue_size", nil)
	p.sinkTotal = float64(m.sink.total())
	for _, c := range m.s.clients {
		p.arrived = append(p.arrived, float64(m.sink.uniqueOf(c.id)))
	}
	for _, a := range m.agents {
		s, _ := a.col.Scraper.Get()
		p.agentSendFailed += zero(harness.Value(s, "otelcol_exporter_send_failed_spans", nil))
		p.agentQueued += zero(harness.Value(s, "otelcol_exporter_queue_size", nil))
	}

	r.mu.Lock()
	r.points = append(r.points, p)
	r.mu.Unlock()
	if r.w == nil {
		return
	}
	row := []string{
		f64(p.t, 3), p.phase, b2s(p.stress), b2s(p.alive), strconv.Itoa(p.restarts), f64(p.oomKills, 0),
		f64(p.wsPct, 2), f64(p.cpuPct, 1), f64(p.state, 0), f64(p.openDuration, 2),
		f64(p.cpuSlow, 4), f64(p.cpuFast, 4), f64(p.mem, 4), f64(p.cpuEnter, 2), f64(p.cpuHard, 2), f64(p.memEnter, 2), f64(p.memHard, 2),
		f64(p.allowed, 0), f64(p.shed, 0), f64(p.open, 0), f64(p.budget, 0), f64(p.held, 0), f64(p.reserved, 0), f64(p.budgetLimit, 0),
		f64(p.gwAccepted, 0), f64(p.gwSent, 0), f64(p.gwQueue, 0), f64(p.sinkTotal, 0), f64(p.agentSendFailed, 0), f64(p.agentQueued, 0),
	}
	for _, a := range p.arrived {
		row = append(row, f64(a, 0))
	}
	r.w.Write(row)
	_ = r.w.Flush()
}

// f64 formats v, "" for NaN.
func f64(v float64, prec int) string {
	if math.IsNaN(v) {
		return ""
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func b2s(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// openSpell is one Open of the gateway's traces state machine, as the
// timeline saw it.
type openSpell struct {
	// From and To: the first sample in Open and the first after it (To is
	// NaN when the timeline ended in Open); MaxReported: the largest
	// otelcol_throttle_open_duration seen in it.
	From, To, MaxReported float64
}

// Length is how long the Open lasted by the samples.
func (o openSpell) Length() float64 { return o.To - o.From }

// opens finds the Opens in the timeline: runs of samples with state 2. A
// sample without a reading (NaN) neither starts nor ends one.
func opens(points []point) []openSpell {
	var out []openSpell
	var cur *openSpell
	for _, p := range points {
		if math.IsNaN(p.state) {
			continue
		}
		if p.state == 2 {
			if cur == nil {
				out = append(out, openSpell{From: p.t, To: math.NaN()})
				cur = &out[len(out)-1]
			}
			if !math.IsNaN(p.openDuration) {
				cur.MaxReported = math.Max(cur.MaxReported, p.openDuration)
			}
			continue
		}
		if cur != nil {
			cur.To = p.t
			cur = nil
		}
	}
	return out
}

// stressSpells are the times the stress ran (memory pulses, CPU load).
func stressSpells(points []point) [][2]float64 {
	var out [][2]float64
	on := false
	for _, p := range points {
		switch {
		case p.stress && !on:
			out = append(out, [2]float64{p.t, math.NaN()})
			on = true
		case !p.stress && on:
			out[len(out)-1][1] = p.t
			on = false
		}
	}
	return out
}

// readTimeline reads a run's timeline.csv back: the clients (from its
// arrived_<client> columns) and the points, as far as the chart needs them.
func readTimeline(path string) (clients []string, points []point, err error) {
	tl, err := report.ReadCSV(path)
	if err != nil {
		return nil, nil, err
	}
	for _, h := range tl.Header {
		if name, ok := strings.CutPrefix(h, "arrived_"); ok {
			clients = append(clients, name)
		}
	}
	for _, row := range tl.Rows {
		num := func(name string) float64 { return report.Num(row[name]) }
		p := point{
			t: num("t_s"), phase: row["phase"], stress: num("stress") == 1, cpuPct: num("cpu_pct"), state: num("state_traces"),
			cpuSlow: num("wl_cpu_slow"), mem: num("wl_memory"), cpuEnter: num("cpu_enter"), cpuHard: num("cpu_hard"),
			memEnter: num("memory_enter"), memHard: num("memory_hard"),
			shed: num("denied_shed"), open: num("denied_open"), budget: num("denied_budget"),
		}
		for _, c := range clients {
			p.arrived = append(p.arrived, num("arrived_"+c))
		}
		points = append(points, p)
	}
	return clients, points, nil
}

// redrawChart draws dir's timeline.png again from its timeline.csv, with
// the title of its report.md.
func redrawChart(dir string) error {
	clients, points, err := readTimeline(filepath.Join(dir, "timeline.csv"))
	if err != nil {
		return err
	}
	title := "Client matrix"
	if md, err := os.ReadFile(filepath.Join(dir, "report.md")); err == nil {
		first, _, _ := strings.Cut(string(md), "\n")
		title = strings.TrimPrefix(first, "# ")
	}
	return report.WriteClientsTimeline(filepath.Join(dir, "timeline.png"), timelineChart(title, clients, points))
}
