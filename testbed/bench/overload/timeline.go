// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"encoding/csv"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// timelineHeader is the header of timeline.csv: one row every 250 ms per
// scenario. Counters (cpu_s, thr_*, rcv_*, lg_*) are cumulative: the
// collector's own counters (thr_*, rcv_*) restart from 0 when the collector
// restarts, the cgroup's (cpu_s, oom_kills) and the generator's (lg_*) do
// not. An empty cell is a missing value (collector down, scrape older than
// 1 s, metric absent): plot it as a gap, never as 0.
var timelineHeader = []string{
	"scenario", "t_s", "unix_ms", "phase",
	// the collector process and its cgroup
	"alive", "pid", "restarts", "oom_kills",
	"ws_bytes", "usage_bytes", "limit_bytes", "ws_pct",
	"cpu_s", "cpu_pct", "nr_throttled",
	// the collector's own metrics (scraped)
	"scrape_age_ms",
	"state_traces", "state_metrics", "state_logs",
	"wl_cpu", "wl_cpu_slow", "wl_cpu_fast", "wl_mem",
	"cpu_enter", "cpu_exit", "cpu_hard", "memory_enter", "memory_exit", "memory_hard",
	"inflight_reserved", "inflight_limit",
	"thr_allowed", "thr_denied_shed", "thr_denied_open", "thr_denied_budget",
	"rcv_accepted_items", "rcv_refused_items", "heap_alloc_bytes",
	// the collector process (/proc/<pid>)
	"threads", "fds",
	// the generator (cumulative since the scenario's start)
	"lg_inflight", "lg_sent", "lg_ok", "lg_rejected", "lg_unavailable", "lg_other", "lg_errors", "lg_skipped",
	"lg_accepted_items", "lg_metrics_sent", "lg_metrics_ok",
	// the collector's goroutines, from its pprof extension every 5 s (only
	// with -pprof; the latest reading, empty when older than 10 s)
	"goroutines",
}

// point is one row of the timeline; the summary is computed from them.
type point struct {
	t        time.Duration
	phase    string
	alive    bool
	restarts int
	cg       harness.CgStats
	cgOK     bool
	wsPct    float64
	cpuPct   float64 // of the quota over the last interval; <0 unknown
	lg       loadgen.Snapshot
	maxState map[string]float64
	// heap is otelcol_process_runtime_heap_alloc_bytes (<0 unknown);
	// threads and fds are the collector's OS threads and open file
	// descriptors (<0 unknown).
	heap, threads, fds float64
	// goroutines is the latest reading of the pprof extension (<0 unknown),
	// taken at goroutinesAt: one reading spans several points.
	goroutines   float64
	goroutinesAt time.Time
}

type recorder struct {
	scenario string
	start    time.Time
	cpus     float64
	cg       *harness.Cgroup
	col      *harness.Process
	scr      *harness.Scraper
	gor      *harness.GoroutineScraper // nil without the pprof extension
	runner   func() *loadgen.Runner    // current generator, nil before it starts
	w        *csv.Writer
	logf     func(string, ...any)
	// loadDone: the generator has finished; later rows are "cooldown".
	loadDone atomic.Bool

	mu     sync.Mutex
	points []point
}

func f64(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

// run samples every interval until ctx ends.
func (r *recorder) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var prevCPU time.Duration
	var prevAt time.Time
	for {
		now := time.Now()
		p := point{t: now.Sub(r.start), cpuPct: -1, heap: -1, threads: -1, fds: -1, goroutines: -1}
		pid, alive, restarts := r.col.State()
		p.alive, p.restarts = alive, restarts
		st, err := r.cg.Stats()
		p.cg, p.cgOK = st, err == nil
		if p.cgOK && st.Limit > 0 {
			p.wsPct = 100 * float64(st.WorkingSet) / float64(st.Limit)
		}
		if p.cgOK && !prevAt.IsZero() {
			p.cpuPct = 100 * (st.CPUUsage - prevCPU).Seconds() / (now.Sub(prevAt).Seconds() * r.cpus)
		}
		if p.cgOK {
			prevCPU, prevAt = st.CPUUsage, now
		}
		if lg := r.runner(); lg != nil {
			p.lg = lg.Snapshot()
			p.phase = p.lg.Phase
		}
		if r.loadDone.Load() {
			p.phase = "cooldown"
		}
		row := []string{
			r.scenario, f64(p.t.Seconds(), 3), strconv.FormatInt(now.UnixMilli(), 10), p.phase,
			b2s(alive), strconv.Itoa(pid), strconv.Itoa(restarts),
		}
		if p.cgOK {
			row = append(row, u64(st.OOMKills), u64(st.WorkingSet), u64(st.Usage), u64(st.Limit), f64(p.wsPct, 2),
				f64(st.CPUUsage.Seconds(), 3), opt(p.cpuPct >= 0, p.cpuPct, 1), u64(st.NrThrottled))
		} else {
			row = append(row, "", "", "", "", "", "", "", "")
		}
		samples, at := r.scr.Get()
		fresh := alive && !at.IsZero() && now.Sub(at) < time.Second
		p.maxState = map[string]float64{}
		metric := func(name string, labels map[string]string, prec int) string {
			if !fresh {
				return ""
			}
			v, ok := harness.Sum(samples, name, labels)
			if !ok {
				return ""
			}
			return f64(v, prec)
		}
		if fresh {
			row = append(row, strconv.FormatInt(now.Sub(at).Milliseconds(), 10))
		} else {
			row = append(row, "")
		}
		for _, s := range []string{"traces", "metrics", "logs"} {
			v := metric("otelcol_throttle_state", map[string]string{"signal": s}, 0)
			row = append(row, v)
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				p.maxState[s] = x
			}
		}
		for _, k := range []string{"cpu", "cpu_slow", "cpu_fast", "memory", "cpu_enter", "cpu_exit", "cpu_hard", "memory_enter", "memory_exit", "memory_hard"} {
			row = append(row, metric("otelcol_throttle_water_level", map[string]string{"kind": k}, 4))
		}
		row = append(row,
			metric("otelcol_throttle_inflight_bytes", map[string]string{"budget": "reserved"}, 0),
			metric("otelcol_throttle_inflight_bytes", map[string]string{"budget": "limit"}, 0),
			metric("otelcol_throttle_requests", map[string]string{"decision": "allowed"}, 0),
			metric("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "shed"}, 0),
			metric("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "open"}, 0),
			metric("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "budget"}, 0),
			sumOf(fresh, samples, "otelcol_receiver_accepted_spans", "otelcol_receiver_accepted_metric_points", "otelcol_receiver_accepted_log_records"),
			sumOf(fresh, samples, "otelcol_receiver_refused_spans", "otelcol_receiver_refused_metric_points", "otelcol_receiver_refused_log_records"),
			metric("otelcol_process_runtime_heap_alloc_bytes", nil, 0),
		)
		if v, err := strconv.ParseFloat(row[len(row)-1], 64); err == nil {
			p.heap = v
		}
		if alive {
			p.threads, p.fds = harness.ProcCounts(pid)
		}
		row = append(row, opt(p.threads >= 0, p.threads, 0), opt(p.fds >= 0, p.fds, 0))
		lg := p.lg
		m := lg.PerSignal[loadgen.Metrics]
		row = append(row, i64(lg.Inflight), i64(lg.Total.Sent), i64(lg.Total.OK), i64(lg.Total.Rejected), i64(lg.Total.Unavailable),
			i64(lg.Total.Other), i64(lg.Total.Errors), i64(lg.Total.Skipped), i64(lg.Total.AcceptedItems), i64(m.Sent), i64(m.OK))
		if r.gor != nil && alive {
			if n, at := r.gor.Get(); !at.IsZero() && now.Sub(at) < 2*harness.GoroutineEvery {
				p.goroutines, p.goroutinesAt = n, at
			}
		}
		row = append(row, opt(p.goroutines >= 0, p.goroutines, 0))
		r.mu.Lock()
		r.points = append(r.points, p)
		if err := r.w.Write(row); err != nil {
			r.logf("timeline: %v", err)
		}
		r.w.Flush()
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sumOf(fresh bool, samples []harness.Sample, names ...string) string {
	if !fresh {
		return ""
	}
	var total float64
	found := false
	for _, n := range names {
		if v, ok := harness.Sum(samples, n, nil); ok {
			total += v
			found = true
		}
	}
	if !found {
		return ""
	}
	return f64(total, 0)
}

func b2s(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
func u64(v uint64) string { return strconv.FormatUint(v, 10) }
func i64(v int64) string  { return strconv.FormatInt(v, 10) }
func opt(ok bool, v float64, prec int) string {
	if !ok {
		return ""
	}
	return f64(v, prec)
}
