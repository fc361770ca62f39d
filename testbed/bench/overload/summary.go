// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// summary is one scenario's row of summary.csv (the report's table).
type summary struct {
	Scenario, Load                                  string
	Throttle, MemoryLimiter                         bool
	Seconds                                         float64
	Sent, OK, Rejected, Unavailable, Other, Errors  int64
	Skipped, AcceptedItems                          int64
	Goodput, OKPerSec                               float64
	P50, P99                                        time.Duration
	OOMKills                                        uint64
	Restarts                                        int
	PeakWSPct, MeanCPUPct, PeakCPUPct               float64
	CPUSeconds, CPUSecPerMItems                     float64
	MetricsSent, MetricsOK, MetricsLost             int64
	MaxStateTraces, MaxStateMetrics, GeneratorCores float64
	// LoadAvgStart, LoadAvgEnd: the machine's 1-minute load average when
	// the generator started and when the scenario ended.
	LoadAvgStart, LoadAvgEnd string

	// base and round: the scenario's name without its round, and the
	// round (-repeat; 0 without rounds).
	base  string
	round int

	// For tests of the harness as a library (not in the CSV): the
	// generator's report, every sample, and the collector's metrics as
	// last scraped (after the cooldown).
	report *loadgen.Report
	points []point
	final  []harness.Sample
}

var summaryHeader = []string{
	"scenario", "throttle", "memory_limiter", "load", "seconds",
	"sent", "ok", "rejected_429", "unavailable_503", "other", "errors", "skipped",
	"accepted_items", "goodput_items_s", "ok_req_s", "p50_ms", "p99_ms",
	"oom_kills", "restarts", "peak_ws_pct", "mean_cpu_pct", "peak_cpu_pct", "cpu_s", "cpu_s_per_m_items",
	"metrics_sent", "metrics_ok", "metrics_lost", "max_state_traces", "max_state_metrics", "generator_cores",
	"loadavg_start", "loadavg_end",
}

func summarize(s scenario, e *env, rep *loadgen.Report, st0, stEnd harness.CgStats) *summary {
	sum := &summary{Scenario: s.name, Throttle: s.throttle, MemoryLimiter: s.memoryLimiter, base: s.base, round: s.round}
	if rep != nil {
		for _, p := range rep.Phases {
			if p.Phase.Name != "load" {
				continue
			}
			if p.Phase.Rate > 0 {
				sum.Load = fmt.Sprintf("open %.0f req/s, max %d in flight", p.Phase.Rate, p.Phase.MaxInflight)
			} else {
				sum.Load = fmt.Sprintf("closed c=%d", p.Phase.Concurrency)
			}
			sum.Seconds = p.Issuing.Seconds()
			c := p.Total
			sum.Sent, sum.OK, sum.Rejected, sum.Unavailable, sum.Other, sum.Errors = c.Sent, c.OK, c.Rejected, c.Unavailable, c.Other, c.Errors
			sum.Skipped, sum.AcceptedItems = c.Skipped, c.AcceptedItems
			sum.Goodput, sum.OKPerSec = p.Goodput(), float64(c.OK)/p.Issuing.Seconds()
			sum.P50, sum.P99 = p.P50, p.P99
			m := p.PerSignal[loadgen.Metrics]
			sum.MetricsSent, sum.MetricsOK = m.Sent, m.OK
			sum.MetricsLost = m.Sent - m.OK
			sum.GeneratorCores = p.GeneratorCPU.Seconds() / p.Drained.Sub(p.Start).Seconds()
		}
	}
	sum.OOMKills = stEnd.OOMKills - st0.OOMKills
	_, _, sum.Restarts = e.col.State()
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	sum.points = append([]point(nil), e.rec.points...)
	var cpuSum float64
	var n int
	var first, last *point
	sum.MaxStateTraces, sum.MaxStateMetrics = -1, -1
	for i := range e.rec.points {
		p := &e.rec.points[i]
		sum.PeakWSPct = max(sum.PeakWSPct, p.wsPct)
		if v, ok := p.maxState["traces"]; ok {
			sum.MaxStateTraces = max(sum.MaxStateTraces, v)
		}
		if v, ok := p.maxState["metrics"]; ok {
			sum.MaxStateMetrics = max(sum.MaxStateMetrics, v)
		}
		if p.phase != "load" || !p.cgOK {
			continue
		}
		if first == nil {
			first = p
		}
		last = p
		if p.cpuPct >= 0 {
			cpuSum += p.cpuPct
			n++
			sum.PeakCPUPct = max(sum.PeakCPUPct, p.cpuPct)
		}
	}
	if n > 0 {
		sum.MeanCPUPct = cpuSum / float64(n)
	}
	if first != nil && last != first {
		sum.CPUSeconds = (last.cg.CPUUsage - first.cg.CPUUsage).Seconds()
		// Accepted items over the same window as the CPU, from the
		// generator's snapshots.
		if items := last.lg.Total.AcceptedItems - first.lg.Total.AcceptedItems; items > 0 {
			sum.CPUSecPerMItems = sum.CPUSeconds / (float64(items) / 1e6)
		}
	}
	return sum
}

func (s *summary) row() []string {
	b := strconv.FormatBool
	ms := func(d time.Duration) string { return f64(float64(d)/1e6, 1) }
	return []string{
		s.Scenario, b(s.Throttle), b(s.MemoryLimiter), s.Load, f64(s.Seconds, 1),
		i64(s.Sent), i64(s.OK), i64(s.Rejected), i64(s.Unavailable), i64(s.Other), i64(s.Errors), i64(s.Skipped),
		i64(s.AcceptedItems), f64(s.Goodput, 0), f64(s.OKPerSec, 1), ms(s.P50), ms(s.P99),
		u64(s.OOMKills), strconv.Itoa(s.Restarts), f64(s.PeakWSPct, 1), f64(s.MeanCPUPct, 1), f64(s.PeakCPUPct, 1),
		f64(s.CPUSeconds, 2), f64(s.CPUSecPerMItems, 3),
		i64(s.MetricsSent), i64(s.MetricsOK), i64(s.MetricsLost), f64(s.MaxStateTraces, 0), f64(s.MaxStateMetrics, 0),
		f64(s.GeneratorCores, 2), s.LoadAvgStart, s.LoadAvgEnd,
	}
}

// writeSummaries rewrites summary.csv and summary.md after every scenario,
// so that an interrupted run keeps what it measured.
func writeSummaries(o options, sums []*summary) error {
	rows := make([][]string, len(sums))
	for i, s := range sums {
		rows[i] = s.row()
	}
	if err := harness.WriteSummaries(o.out, summaryHeader, rows, func(w io.Writer) { printTables(w, o, sums) }); err != nil {
		return err
	}
	if o.repeat <= 1 {
		return nil
	}
	// The medians go into the report too (report.ExtraFile).
	var b bytes.Buffer
	printMedians(&b, sums)
	return os.WriteFile(filepath.Join(o.out, report.ExtraFile), b.Bytes(), 0o644)
}

// printTables writes the summary table and, with rounds (-repeat), the
// medians.
func printTables(w io.Writer, o options, sums []*summary) {
	printSummaries(w, sums)
	if o.repeat > 1 {
		printMedians(w, sums)
	}
}

// roundMedian is one scenario's line of the medians table: over its rounds,
// the goodput, its share of the same round's A, and the p99 of accepted
// requests.
type roundMedian struct {
	Scenario            string
	Rounds              int
	Goodput             float64
	OfA, OfAMin, OfAMax float64 // NaN without an A in the rounds
	P99, P99Min, P99Max time.Duration
	OOMKills            uint64
}

// medians groups the rounds of each scenario, in the order of their first
// round. A scenario's share of A is taken round by round, against the A
// measured minutes before it, before the median: the machine's speed
// moves between rounds as much as the differences measured.
func medians(sums []*summary) []roundMedian {
	aOf := map[int]float64{}
	var order []string
	byName := map[string][]*summary{}
	for _, s := range sums {
		name, r := cmp.Or(s.base, s.Scenario), s.round
		if name == "A" && s.Goodput > 0 {
			aOf[r] = s.Goodput
		}
		if _, ok := byName[name]; !ok {
			order = append(order, name)
		}
		byName[name] = append(byName[name], s)
	}
	out := make([]roundMedian, 0, len(order))
	for _, name := range order {
		runs := byName[name]
		m := roundMedian{Scenario: name, Rounds: len(runs), OfA: math.NaN(), OfAMin: math.NaN(), OfAMax: math.NaN()}
		var goodput, ofA, p99 []float64
		for _, s := range runs {
			goodput = append(goodput, s.Goodput)
			p99 = append(p99, float64(s.P99))
			if a := aOf[s.round]; a > 0 {
				ofA = append(ofA, s.Goodput/a)
			}
			m.OOMKills += s.OOMKills
		}
		m.Goodput = median(goodput)
		if len(ofA) > 0 {
			m.OfA, m.OfAMin, m.OfAMax = median(ofA), slices.Min(ofA), slices.Max(ofA)
		}
		m.P99, m.P99Min, m.P99Max = time.Duration(median(p99)), time.Duration(slices.Min(p99)), time.Duration(slices.Max(p99))
		out = append(out, m)
	}
	return out
}

// median returns the median of v; NaN when v is empty.
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(v))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// printMedians writes the medians table (-repeat).
func printMedians(w io.Writer, sums []*summary) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Medians over the rounds; % of A is taken against the same round's A, then the median (min–max):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | rounds | goodput items/s | % of A | p99 ok ms | OOM kills |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	for _, m := range medians(sums) {
		ofA := "n/a"
		if !math.IsNaN(m.OfA) {
			ofA = fmt.Sprintf("%.0f (%.0f–%.0f)", 100*m.OfA, 100*m.OfAMin, 100*m.OfAMax)
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %s | %.0f (%.0f–%.0f) | %d |\n",
			m.Scenario, m.Rounds, m.Goodput, ofA, ms(m.P99), ms(m.P99Min), ms(m.P99Max), m.OOMKills)
	}
}

func printSummaries(w io.Writer, sums []*summary) {
	fmt.Fprintln(w, "| scenario | load | goodput items/s | ok req/s | rejected (429/RE) | 503/UNAV | errors | skipped | OOM kills | restarts | peak WS % | CPU % mean / peak | p99 ok ms | CPU s / M items | metrics lost | max state traces |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range sums {
		name := s.Scenario
		switch {
		case s.Throttle:
			name += " (throttle)"
		case s.MemoryLimiter:
			name += " (memory_limiter)"
		default:
			name += " (off)"
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %.1f | %d | %d | %d | %d | %d | %d | %.1f | %.0f / %.0f | %.0f | %.3f | %d of %d | %s |\n",
			name, s.Load, s.Goodput, s.OKPerSec, s.Rejected, s.Unavailable, s.Errors, s.Skipped, s.OOMKills, s.Restarts,
			s.PeakWSPct, s.MeanCPUPct, s.PeakCPUPct, float64(s.P99)/1e6, s.CPUSecPerMItems, s.MetricsLost, s.MetricsSent,
			stateName(s.MaxStateTraces))
	}
}

func stateName(v float64) string {
	switch v {
	case 0:
		return "Normal"
	case 1:
		return "Shedding"
	case 2:
		return "Open"
	}
	return "n/a"
}
