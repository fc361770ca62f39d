// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// tierTimelineHeader is the header of the tier's timeline.csv: one row
// every interval per scenario, the agents, the sink and the load
// generators as in the fleet's timeline (see timelineHeader), the machine's
// CPU, and the replicas the balancer counts as up. An empty cell is a
// missing value.
var tierTimelineHeader = slices.Concat([]string{"scenario", "round", "factor", "t_s", "unix_ms", "phase"},
	flowHeader, loadHeader, []string{"host_cpu_pct", "lb_up"})

// replicaTimelineHeader is the header of timeline-replicas.csv: one row
// every interval per replica. Its cgroup (cpu_s its CPU time, cumulative;
// cpu_pct its use over the interval, % of its quota); its own metrics,
// empty while it is down or its scrape is stale, and restarting from 0
// with it: the throttle's state (0 Normal, 1 Shedding, 2 Open), water
// levels (cpu: the level the CPU lines apply to; memory: the memory
// level) and lines, its admission decisions (cumulative requests, by
// decision and reason), the requests it holds, its receiver's and
// exporter's spans; then what the balancer counts of it (lb_conns: open
// connections, lb_conns_total: every connection it was given). The
// autoscaling signal is computed from these: the levels, and the admitted
// and refused requests over a window.
var replicaTimelineHeader = slices.Concat(
	[]string{"scenario", "round", "factor", "t_s", "unix_ms", "phase", "replica", "cpus"},
	procHeader,
	[]string{
		"scrape_age_ms", "state", "wl_cpu", "wl_cpu_slow", "wl_cpu_fast", "wl_memory", "cpu_enter", "memory_enter", "memory_hard",
		"req_allowed", "req_denied_shed", "req_denied_open", "req_denied_budget", "held_requests",
		"accepted_spans", "refused_spans", "sent_spans", "send_failed_spans", "enqueue_failed_spans", "queue_size",
		"lb_status", "lb_conns", "lb_conns_total",
	})

// tierPoint is what the summary and the drain need of one interval.
type tierPoint struct {
	basePoint
	reps []replicaPoint
}

// replicaPoint is one replica at one interval.
type replicaPoint struct {
	procPoint
	// From its own metrics; NaN when stale or absent (no throttle).
	state, held                                   float64
	allowed, deniedShed, deniedOpen, deniedBudget float64
	accepted, refused                             float64
	lb                                            haproxy.ServerStats
	lbOK                                          bool
}

// tierRecorder samples a tier every interval into the two timelines.
type tierRecorder struct {
	timeline[tierPoint]
	t      *tier
	tw, rw *harness.CSVFile
	// prev: each replica's CPU time at the previous point (the sampling
	// goroutine's).
	prev []cpuMark
}

func newTierRecorder(t *tier, tw, rw *harness.CSVFile) *tierRecorder {
	return &tierRecorder{timeline: newTimeline[tierPoint](t.agents, t.sink), t: t, tw: tw, rw: rw, prev: make([]cpuMark, len(t.replicas))}
}

func (r *tierRecorder) run(ctx context.Context, interval time.Duration) {
	harness.Every(ctx, interval, func() { r.sample(time.Now(), interval) })
}

func (r *tierRecorder) sample(now time.Time, interval time.Duration) {
	p := tierPoint{basePoint: r.begin(now)}
	lbStats, lbErr := r.t.lb.stats()
	head := []string{r.t.scenario.name, strconv.Itoa(r.t.round), f64(r.t.factor, 2), f64(p.t.Seconds(), 3), strconv.FormatInt(now.UnixMilli(), 10), p.phase}
	lbUp := 0
	var rows [][]string
	for i, rep := range r.t.replicas {
		rp, row := r.sampleReplica(now, interval, rep, &r.prev[i])
		rp.lb, rp.lbOK = lbStats[rep.name]
		if lbErr != nil {
			rp.lbOK = false
		}
		if rp.lbOK {
			if rp.lb.Status == "UP" {
				lbUp++
			}
			row = append(row, rp.lb.Status, f64(rp.lb.Conns, 0), f64(rp.lb.ConnsTotal, 0))
		} else {
			row = append(row, "", "", "")
		}
		p.reps = append(p.reps, rp)
		rows = append(rows, slices.Concat(head, row))
	}
	r.end(now, &p.basePoint)
	trow := slices.Concat(head, p.flowRow(), loadRow(p.lg), []string{opt(nonNeg(p.hostPct), 1), ""})
	if lbErr == nil {
		trow[len(trow)-1] = strconv.Itoa(lbUp)
	}
	r.add(p, func() {
		r.tw.Write(trow)
		_ = r.tw.Flush()
		r.rw.Write(rows...)
		_ = r.rw.Flush()
	})
}

// nonNeg is v, or NaN (a missing value) when it is negative (unknown).
func nonNeg(v float64) float64 {
	if v < 0 {
		return math.NaN()
	}
	return v
}

// sampleReplica reads one replica's cgroup and metrics, and returns them
// and its timeline row up to queue_size.
func (r *tierRecorder) sampleReplica(now time.Time, interval time.Duration, rep *replica, prev *cpuMark) (replicaPoint, []string) {
	var rp replicaPoint
	var proc *harness.Process // nil: not started yet
	m := rep.m.Load()
	if m != nil {
		proc = m.proc
	}
	var cols []string
	rp.procPoint, cols = readProc(now, proc, rep.cg, rep.cpus, prev)
	row := slices.Concat([]string{rep.name, f64(rep.cpus, 3)}, cols)

	// Its own metrics: only a fresh scrape of a live process.
	var gs []harness.Sample
	var at time.Time
	if m != nil {
		gs, at = m.scr.Get()
	}
	fresh := rp.alive && !at.IsZero() && now.Sub(at) < 2*interval
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
	// The memory kinds are named memory* from the configuration's rename
	// on, mem* before it.
	lvl := func(kinds ...string) float64 {
		for _, k := range kinds {
			if v := g("otelcol_throttle_water_level", map[string]string{"kind": k}); !math.IsNaN(v) {
				return v
			}
		}
		return math.NaN()
	}
	req := func(decision, reason string) float64 {
		labels := map[string]string{"decision": decision}
		if reason != "" {
			labels["reason"] = reason
		}
		return g("otelcol_throttle_requests", labels)
	}
	rp.state = g("otelcol_throttle_state", map[string]string{"signal": "traces"})
	rp.allowed, rp.deniedShed, rp.deniedOpen, rp.deniedBudget = req("allowed", ""), req("denied", "shed"), req("denied", "open"), req("denied", "budget")
	rp.held = g("otelcol_throttle_held_requests", nil)
	rp.accepted, rp.refused = g("otelcol_receiver_accepted_spans", nil), g("otelcol_receiver_refused_spans", nil)
	row = append(row, opt(rp.state, 0), opt(lvl("cpu"), 4), opt(lvl("cpu_slow"), 4), opt(lvl("cpu_fast"), 4), opt(lvl("memory", "mem"), 4),
		opt(lvl("cpu_enter"), 2), opt(lvl("memory_enter", "mem_enter"), 2), opt(lvl("memory_hard", "mem_hard"), 2),
		opt(rp.allowed, 0), opt(rp.deniedShed, 0), opt(rp.deniedOpen, 0), opt(rp.deniedBudget, 0), opt(rp.held, 0),
		opt(rp.accepted, 0), opt(rp.refused, 0),
		opt(g("otelcol_exporter_sent_spans", nil), 0), opt(g("otelcol_exporter_send_failed_spans", nil), 0),
		opt(g("otelcol_exporter_enqueue_failed_spans", nil), 0), opt(g("otelcol_exporter_queue_size", nil), 0))
	return rp, row
}
