// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
)

// autoscaleRun is one run of the replay: one scenario under one signal.
type autoscaleRun struct {
	scenario, signal string
	round, order     int
	// capacity is one replica's capacity, offered the load's rate, spans/s.
	capacity, offered float64
	needed, max       int
	loadSeconds       float64
	// life is each replica's added, collector-up and ready times, seconds
	// from the load's start (NaN: never; the first replica's are before
	// the load).
	life [][3]float64
	// scaledAt and readyAt: when the scale and the ready replicas reached
	// n (index n-1), seconds from the load's start (NaN: never).
	scaledAt, readyAt []float64
	syncs             []syncRecord
	// sinkT, sink: the sink's rate over 5 s windows.
	sinkT, sink []float64
	// afterNeeded is the sink's rate from the needed count's readiness to
	// the load's end (NaN: not reached 5 s before the end).
	afterNeeded float64
	sum         *tierSummary
}

// neededAt is when the needed count of replicas was ready (NaN: never).
func (r *autoscaleRun) neededAt() float64 { return r.readyAt[r.needed-1] }

// result is the run's record once it has drained.
func (s *scaler) result(caps []float64, offered float64, round, order int, loadEnd time.Time, sum *tierSummary) *autoscaleRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.t.replicas)
	rel := func(t time.Time) float64 {
		if t.IsZero() {
			return math.NaN()
		}
		return t.Sub(s.loadStart).Seconds()
	}
	run := &autoscaleRun{
		scenario: s.scenario, signal: s.signal, round: round, order: order,
		capacity: caps[0], offered: offered, needed: neededReplicas(caps, offered), max: n,
		loadSeconds: loadEnd.Sub(s.loadStart).Seconds(), syncs: slices.Clone(s.syncs), afterNeeded: math.NaN(), sum: sum,
	}
	var ready []float64
	for _, p := range s.pods {
		run.life = append(run.life, [3]float64{rel(p.added), rel(p.up), rel(p.ready)})
		if !p.ready.IsZero() {
			ready = append(ready, rel(p.ready))
		}
	}
	slices.Sort(ready)
	run.scaledAt, run.readyAt = make([]float64, n), make([]float64, n)
	for i := range n {
		run.scaledAt[i], run.readyAt[i] = math.NaN(), math.NaN()
		if i < len(ready) {
			run.readyAt[i] = ready[i]
		}
	}
	run.scaledAt[0] = run.life[0][0]
	for _, rec := range s.syncs {
		for c := 1; c < rec.scale; c++ {
			if math.IsNaN(run.scaledAt[c]) {
				run.scaledAt[c] = rec.at.Seconds()
			}
		}
	}

	// The sink's rate, from the recorder's points.
	pts := s.t.rec.snapshot()
	at := func(p tierPoint) float64 { return s.t.rec.start.Add(p.t).Sub(s.loadStart).Seconds() }
	last := -1
	for i, p := range pts {
		if at(p) < 0 {
			continue
		}
		if last < 0 {
			last = i
			continue
		}
		if dt := at(p) - at(pts[last]); dt >= 5 {
			run.sinkT = append(run.sinkT, at(p))
			run.sink = append(run.sink, (p.sinkSpans-pts[last].sinkSpans)/dt)
			last = i
		}
	}
	if from := run.neededAt(); !math.IsNaN(from) && run.loadSeconds-from >= 5 {
		a, b := -1, -1
		for i, p := range pts {
			if a < 0 && at(p) >= from {
				a = i
			}
			if at(p) <= run.loadSeconds {
				b = i
			}
		}
		if a >= 0 && b > a {
			run.afterNeeded = (pts[b].sinkSpans - pts[a].sinkSpans) / (at(pts[b]) - at(pts[a]))
		}
	}
	return run
}

// autoscaleReport writes the replay's summary.csv, report.md and charts.
type autoscaleReport struct {
	o       options
	caps    []float64
	machine string
	runs    []*autoscaleRun
}

// write rewrites the files after every run, so that an interrupted run
// keeps what it measured.
func (r *autoscaleReport) write() error {
	f, err := harness.CreateCSV(filepath.Join(r.o.out, "summary.csv"), r.summaryHeader())
	if err != nil {
		return err
	}
	for _, run := range r.runs {
		f.Write(r.summaryRow(run))
	}
	if err := f.Close(); err != nil {
		return err
	}
	charts, chartErr := report.WriteAutoscaleCharts(r.o.out, r.chartData())
	var md bytes.Buffer
	r.markdown(&md, charts)
	return errors.Join(chartErr, os.WriteFile(filepath.Join(r.o.out, "report.md"), md.Bytes(), 0o644))
}

func (r *autoscaleReport) summaryHeader() []string {
	h := []string{"scenario", "signal", "target", "protocol", "round", "order", "replicas_max", "needed", "capacity_one_spans_s", "offered_spans_s", "load_s"}
	for n := 2; n <= len(r.caps); n++ {
		h = append(h, fmt.Sprintf("scaled_%d_s", n), fmt.Sprintf("ready_%d_s", n))
	}
	return append(h, "needed_ready_s",
		"loadgen_accepted", "agent_accepted", "agent_sent", "agent_send_failed", "agent_enqueue_failed", "sink_spans", "delivered_pct", "lost", "duplicates",
		"load_sink_spans_s", "after_needed_sink_spans_s", "drain_s", "oom_kills", "restarts", "mean_host_cpu_pct", "loadavg_start", "loadavg_end")
}

func (r *autoscaleReport) summaryRow(run *autoscaleRun) []string {
	s := run.sum
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	row := []string{
		run.scenario, run.signal, f64(autoscaleSignals[run.signal].target, 2), r.o.protocol, strconv.Itoa(run.round), strconv.Itoa(run.order),
		strconv.Itoa(run.max), strconv.Itoa(run.needed), f64(run.capacity, 0), f64(run.offered, 0), f64(run.loadSeconds, 1),
	}
	for n := 2; n <= run.max; n++ {
		row = append(row, opt(run.scaledAt[n-1], 1), opt(run.readyAt[n-1], 1))
	}
	return append(row, opt(run.neededAt(), 1),
		i(s.LoadgenAccepted), i(s.AgentAccepted), i(s.AgentSent), i(s.AgentSendFailed), i(s.AgentEnqueueFailed), i(s.SinkSpans),
		f64(s.DeliveredPct, 2), i(s.Lost), i(s.Duplicates),
		f64(s.BurstSinkRate, 0), opt(run.afterNeeded, 0), f64(s.DrainSeconds, 1), strconv.FormatUint(s.OOMKills, 10), strconv.Itoa(s.Restarts),
		f64(s.MeanHostCPUPct, 1), s.LoadAvgStart, s.LoadAvgEnd)
}

// capacitySource says where the replicas' capacity came from.
func capacitySource(o options) string {
	if slices.Contains(o.set, "tier-capacity") {
		return "given with -tier-capacity"
	}
	return "the stock gateway of its size, measured in this run as the tier measures it: capacity.md"
}

// scenarios is the scenarios of the runs, in their first order.
func (r *autoscaleReport) scenarios() []string {
	var out []string
	for _, run := range r.runs {
		if !slices.Contains(out, run.scenario) {
			out = append(out, run.scenario)
		}
	}
	return out
}

func (r *autoscaleReport) chartData() report.AutoscaleCharts {
	c := report.AutoscaleCharts{Scenarios: r.scenarios(), Tolerance: hpaTolerance, Max: len(r.caps)}
	for _, sc := range c.Scenarios {
		var runs []report.AutoscaleRun
		for _, run := range r.runs {
			if run.scenario != sc {
				continue
			}
			c.LoadEnd, c.Offered, c.Needed = run.loadSeconds, run.offered, run.needed
			ar := report.AutoscaleRun{Round: run.round, Signal: run.signal, ReadyT: []float64{0}, Ready: []float64{0}, SinkT: run.sinkT, Sink: run.sink}
			for n, t := range run.readyAt {
				if !math.IsNaN(t) {
					ar.ReadyT, ar.Ready = append(ar.ReadyT, max(t, 0)), append(ar.Ready, float64(n+1))
				}
			}
			for _, rec := range run.syncs {
				ar.SyncT, ar.Ratio = append(ar.SyncT, rec.at.Seconds()), append(ar.Ratio, rec.metric/autoscaleSignals[run.signal].target)
			}
			runs = append(runs, ar)
		}
		c.Runs = append(c.Runs, runs)
	}
	return c
}

// pair is the runs of one round and scenario under the two signals.
func (r *autoscaleReport) pair(round int, scenario string) (cpu, demand *autoscaleRun) {
	for _, run := range r.runs {
		if run.round != round || run.scenario != scenario {
			continue
		}
		switch run.signal {
		case signalCPU:
			cpu = run
		case signalDemand:
			demand = run
		}
	}
	return cpu, demand
}

func (r *autoscaleReport) markdown(w io.Writer, charts []string) {
	o := r.o
	fmt.Fprintf(w, "# Autoscaling replay over %s agents\n\n", strings.ToUpper(o.protocol))
	fmt.Fprintf(w, "```\n%s```\n\n", r.machine)
	fmt.Fprintf(w, "Up to %d replicas of the throttle distribution (shipped defaults; %s CPU, %d MiB each) behind HAProxy (TCP, round-robin), "+
		"starting from one in rotation; %d stock agents over %s (compression: %s), %d-span requests of %d-byte attributes; "+
		"a %s warmup at a fifth of one replica's capacity, then %s at %g times it (%.0f spans/s), then the drain. "+
		"One replica's capacity: %.0f spans/s (%s); the load needs %d replicas.\n\n",
		len(r.caps), joinFloats(o.tier.cpus, 2), o.memMiB, o.agents, o.protocol, compressionName(o.agentCompression), o.spans, o.attrSize,
		o.warmup, o.burst, o.factors[0], o.factors[0]*r.caps[0], r.caps[0], capacitySource(o), neededReplicas(r.caps, o.factors[0]*r.caps[0]))
	fmt.Fprintf(w, "The HPA replayed (autoscaling/v2, its documented algorithm and defaults): a sync every %s from the load's start; "+
		"desired = ceil(pods × average / target) over the pods counted, no change while |average / target − 1| ≤ %g; "+
		"on a scale-up a pod without a metric, or set aside, counts as 0; "+
		"scale-up stabilisation 0 s; per 15 s at most double the replicas or add 4, whichever is more; at most %d replicas; no scale-down. "+
		"A replica added is started then, and turns ready at the first readiness probe that finds its collector answering "+
		"(probes at its start and every %s, a readinessProbe's default period; the one at its start finds it still starting), "+
		"when it joins the balancer's rotation. The signals, read at the sync itself (a cluster adds its metrics pipeline's delay to both):\n\n",
		hpaSyncPeriod, hpaTolerance, len(r.caps), o.autoscale.probePeriod)
	for _, sig := range o.autoscale.signals {
		fmt.Fprintf(w, "- **%s**, target %g: %s.\n", sig, autoscaleSignals[sig].target, autoscaleSignals[sig].what)
	}
	fmt.Fprintf(w, "\nRounds run each scenario under both signals back to back, the order alternating; compare them round by round.\n\n")

	fmt.Fprintln(w, "## Runs")
	fmt.Fprintln(w)
	fmt.Fprint(w, "| round | gateways | HPA on (target) |")
	for n := 2; n <= len(r.caps); n++ {
		fmt.Fprintf(w, " %d replicas: scaled / ready |", n)
	}
	fmt.Fprintln(w, " needed ready at | delivered (sink / accepted by agents) | acknowledged, never delivered | agents: enqueue / send failures (spans) | OOM kills (restarts) | spans/s to the sink: load / once the needed are ready | machine's CPU busy (load) |")
	fmt.Fprint(w, "|---|---|---|")
	for n := 2; n <= len(r.caps); n++ {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w, "---|---|---|---|---|---|---|")
	for _, run := range r.runs {
		s := run.sum
		fmt.Fprintf(w, "| %d | %s | %s (%g) |", run.round, run.scenario, run.signal, autoscaleSignals[run.signal].target)
		for n := 2; n <= run.max; n++ {
			fmt.Fprintf(w, " %s / %s |", secs(run.scaledAt[n-1]), secs(run.readyAt[n-1]))
		}
		fmt.Fprintf(w, " **%s** | %.2f%% (%d of %d) | %d | %d / %d | %d (%d) | %.0f / %s | %.0f%% |\n",
			secs(run.neededAt()), s.DeliveredPct, s.SinkSpans, s.AgentAccepted, s.Lost, s.AgentEnqueueFailed, s.AgentSendFailed,
			s.OOMKills, s.Restarts, s.BurstSinkRate, optNote(run.afterNeeded, 0), s.MeanHostCPUPct)
	}
	fmt.Fprintln(w, "\nTimes are seconds from the load's start; \"scaled\": the sync that set the scale to that count; \"ready\": when that many were in rotation.")

	r.verdicts(w)
	r.syncTables(w)
	if len(charts) > 0 {
		fmt.Fprintln(w, "\n## Charts")
		fmt.Fprintln(w)
		for _, c := range charts {
			fmt.Fprintf(w, "![%s](%s)\n\n", filepath.Base(c), filepath.Base(c))
		}
	}
}

// verdicts writes, round by round, whether the demand signal brought the
// tier to the needed replicas no later than CPU and lost nothing.
func (r *autoscaleReport) verdicts(w io.Writer) {
	type row struct {
		round    int
		scenario string
		cpu, dem *autoscaleRun
	}
	var rows []row
	for _, sc := range r.scenarios() {
		for round := 1; round <= r.o.tier.rounds; round++ {
			if cpu, dem := r.pair(round, sc); cpu != nil && dem != nil {
				rows = append(rows, row{round, sc, cpu, dem})
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\n## Demand against CPU, round by round")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| round | gateways | needed ready: demand / CPU | demand no later | demand run: delivered, lost, OOM kills | CPU run: delivered, lost, OOM kills |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, x := range rows {
		d, c := x.dem.neededAt(), x.cpu.neededAt()
		noLater := !math.IsNaN(d) && (math.IsNaN(c) || d <= c)
		fmt.Fprintf(w, "| %d | %s | %s / %s | %s | %s | %s |\n", x.round, x.scenario, secs(d), secs(c), yesNo(noLater), lossNote(x.dem.sum), lossNote(x.cpu.sum))
	}
}

func lossNote(s *tierSummary) string {
	return fmt.Sprintf("%.2f%%, %d, %d", s.DeliveredPct, s.Lost, s.OOMKills)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// syncTables writes the HPA's view at every sync, the two signals side by
// side, per round and scenario.
func (r *autoscaleReport) syncTables(w io.Writer) {
	fmt.Fprintln(w, "\n## The HPA at each sync")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Each cell: replicas ready / in the scale; the signal averaged over the pods counted, and each pod's value († set aside, – no metric); → the scale set; the sink's rate since the previous sync. Each replica's life: added / collector answering / ready, seconds from the load's start.")
	for _, sc := range r.scenarios() {
		for round := 1; round <= r.o.tier.rounds; round++ {
			var runs []*autoscaleRun
			for _, run := range r.runs {
				if run.round == round && run.scenario == sc {
					runs = append(runs, run)
				}
			}
			if len(runs) == 0 {
				continue
			}
			fmt.Fprintf(w, "\n### Round %d, %s\n\n", round, sc)
			fmt.Fprint(w, "| t |")
			for _, run := range runs {
				fmt.Fprintf(w, " HPA on %s (target %g) |", run.signal, autoscaleSignals[run.signal].target)
			}
			fmt.Fprint(w, "\n|---|")
			for range runs {
				fmt.Fprint(w, "---|")
			}
			fmt.Fprintln(w)
			rows := 0
			for _, run := range runs {
				rows = max(rows, len(run.syncs))
			}
			for k := range rows {
				fmt.Fprintf(w, "| %.0f s |", float64(k+1)*hpaSyncPeriod.Seconds())
				for _, run := range runs {
					if k >= len(run.syncs) {
						fmt.Fprint(w, " |")
						continue
					}
					fmt.Fprintf(w, " %s |", syncCell(run, run.syncs[k]))
				}
				fmt.Fprintln(w)
			}
			fmt.Fprintln(w)
			for _, run := range runs {
				var l []string
				for i, life := range run.life {
					if math.IsNaN(life[0]) {
						continue
					}
					l = append(l, fmt.Sprintf("r%d %s / %s / %s", i+1, secs(life[0]), secs(life[1]), secs(life[2])))
				}
				fmt.Fprintf(w, "HPA on %s: %s; load ended at %.0f s.  \n", run.signal, strings.Join(l, "; "), run.loadSeconds)
			}
		}
	}
}

func syncCell(run *autoscaleRun, rec syncRecord) string {
	pods := rec.cpu
	if run.signal == signalDemand {
		pods = rec.demand
	}
	var vals []string
	for _, p := range pods {
		switch p.state {
		case podMissing:
			vals = append(vals, "–")
		case podSetAside:
			vals = append(vals, f64(p.value, 2)+"†")
		default:
			vals = append(vals, f64(p.value, 2))
		}
	}
	return fmt.Sprintf("%d/%d · %s [%s] → %d · %s/s", rec.ready, rec.scaleBefore, optNote(rec.metric, 2), strings.Join(vals, ", "), rec.scale, optNote(rec.sinkRate, 0))
}

// secs is "12.3 s", "before" for a time before the load's start, or
// "never" for NaN.
func secs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "never"
	case v < 0:
		return "before"
	}
	return fmt.Sprintf("%.1f s", v)
}

// optNote is v with prec decimals, or n/a for NaN.
func optNote(v float64, prec int) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return f64(v, prec)
}

// printTable writes the runs' main figures to w.
func (r *autoscaleReport) printTable(w io.Writer) {
	for _, run := range r.runs {
		fmt.Fprintf(w, "round %d %-22s HPA on %-6s needed %d ready at %-8s delivered %6.2f%% lost %d OOM %d sink %.0f spans/s\n",
			run.round, run.scenario, run.signal, run.needed, secs(run.neededAt()), run.sum.DeliveredPct, run.sum.Lost, run.sum.OOMKills, run.sum.BurstSinkRate)
	}
}
