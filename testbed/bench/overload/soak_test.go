// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build soak

package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// The soak: twice the saturating load for minutes; not in the default test run (build tag soak):
//
//	make soak                                  # 10 minutes
//	make soak SOAK_FLAGS='-soak.duration=2m'   # shorter
var (
	soakDuration = flag.Duration("soak.duration", 10*time.Minute, "load phase of the soak")
	soakRate     = flag.Float64("soak.rate", 2400, "open loop requests/s (about twice the saturating rate of the 1 CPU collector; 2x 1204 on the reference machine)")
	soakOut      = flag.String("soak.out", "", "results folder, from the repository root unless absolute (default bench/runs/<UTC date>-soak, git-ignored; make promote makes a run the baseline)")
	soakHeapTol  = flag.Float64("soak.heap-tolerance", 0.25, "allowed growth of the heap floor (and of threads, fds) from the middle to the last third")
	soakGorTol   = flag.Float64("soak.goroutine-tolerance", 0.10, "allowed growth of the goroutine floor (10th percentile of the readings) from the middle to the last third, at least 20 goroutines")
)

// soakGorSlack is the absolute noise allowed on the goroutine count: the
// HTTP server's connection goroutines and the batch processor's come and go
// with the requests in flight.
const soakGorSlack = 20

// TestSoak keeps the distribution with throttle (default thresholds,
// metrics exempt) in a 1 CPU / 300 MiB cgroup at twice its saturating load
// and asserts: no OOM kill, no restart, the working set below the limit at
// every sample, no growth trend of the heap after GC, of the OS threads or
// of the open file descriptors (mean of the last third against the middle
// third), nor of the goroutines (floor of the last third against the
// middle third, within max(10%, 20); medians reported), and the
// throttle's counters consistent with the generator's: allowed + denied =
// requests answered, per signal, over HTTP.
//
// The collector (v0.165.0) exposes no goroutine gauge
// (otelcol_process_*: cpu_seconds, memory_rss, runtime_heap_alloc_bytes,
// runtime_total_alloc_bytes, runtime_total_sys_memory_bytes, uptime), so
// the soak's collector runs contrib's pprof extension on localhost (-pprof)
// and the harness reads "goroutine profile: total N" from
// /debug/pprof/goroutine?debug=1 every 5 s. The heap after GC is approximated by the floor (10th percentile) of
// otelcol_process_runtime_heap_alloc_bytes over each third: the troughs
// of the sawtooth are the live heap right after a collection.
func TestSoak(t *testing.T) {
	harness.RequireCgroups(t)
	harness.TakeMachine(t)
	// The test runs in its package's folder; the runs folder, and a
	// relative -soak.out, are the repository root's, as for the other
	// benchmarks.
	out, err := harness.RunDir(filepath.Join("..", "..", ".."), *soakOut, "soak", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "machine.txt"), []byte(harness.MachineInfo(os.Args)), 0o644); err != nil {
		t.Fatal(err)
	}
	o := options{
		out: out, cpus: 1, memMiB: 300, warmup: 10 * time.Second, warmupRate: 200,
		duration: *soakDuration, cooldown: 5 * time.Second, rateOver: *soakRate, maxInflight: 512, pprof: true,
	}
	// trends: the figures of the growth checks, which the report shows
	// below its table (report.ExtraFile); the report is written whatever
	// failed.
	var trends []string
	defer func() {
		if len(trends) > 0 {
			if err := writeTrends(filepath.Join(out, report.ExtraFile), trends); err != nil {
				t.Errorf("%s: %v", report.ExtraFile, err)
			}
		}
		if files, err := report.Generate(out); err != nil {
			t.Errorf("report: %v", err)
		} else {
			t.Logf("report: %s, %s, %v", files.Markdown, files.HTML, files.PNG)
		}
	}()
	sum := harnessRun(t, o, allScenarios["D"])
	lp := loadPhase(sum.report)
	if lp == nil {
		t.Fatal("no load phase in the generator's report")
	}
	c := lp.Total
	t.Logf("results in %s", out)
	t.Logf("load %s for %s: sent %d, 2xx %d, 429 %d, 503 %d, other %d, errors %d, skipped %d; goodput %.0f items/s, p99 ok %s; CPU mean %.0f%% peak %.0f%% of quota",
		sum.Load, lp.Issuing.Round(time.Second), c.Sent, c.OK, c.Rejected, c.Unavailable, c.Other, c.Errors, c.Skipped,
		sum.Goodput, sum.P99.Round(time.Millisecond), sum.MeanCPUPct, sum.PeakCPUPct)

	// 1. No OOM kill, no restart, working set below the limit throughout.
	t.Logf("OOM kills %d, restarts %d, peak working set %.1f%% of the limit", sum.OOMKills, sum.Restarts, sum.PeakWSPct)
	if sum.OOMKills != 0 || sum.Restarts != 0 {
		t.Errorf("OOM kills %d, restarts %d: want 0 and 0", sum.OOMKills, sum.Restarts)
	}
	if sum.PeakWSPct >= 100 {
		t.Errorf("working set reached %.1f%% of the limit", sum.PeakWSPct)
	}

	// 2. No growth trend: middle third against last third of the load.
	var load []point
	for _, p := range sum.points {
		if p.phase == "load" {
			load = append(load, p)
		}
	}
	if len(load) < 30 {
		t.Fatalf("only %d samples in the load phase", len(load))
	}
	n := len(load)
	mid, end := load[n/3:2*n/3], load[2*n/3:]
	floor := func(ps []point) float64 {
		var v []float64
		for _, p := range ps {
			if p.heap >= 0 {
				v = append(v, p.heap)
			}
		}
		if len(v) == 0 {
			return math.NaN()
		}
		slices.Sort(v)
		return v[len(v)/10]
	}
	mean := func(ps []point, f func(point) float64) float64 {
		var s float64
		var k int
		for _, p := range ps {
			if x := f(p); x >= 0 {
				s += x
				k++
			}
		}
		if k == 0 {
			return math.NaN()
		}
		return s / float64(k)
	}
	tol := *soakHeapTol
	check := func(name string, a, b, slack float64) {
		t.Logf("%s: middle third %.1f, last third %.1f (%+.1f%%)", name, a, b, 100*(b-a)/a)
		verdict := "ok"
		switch {
		case math.IsNaN(a) || math.IsNaN(b):
			verdict = "NOT MEASURED"
			t.Errorf("%s: not measured", name)
		case b > a*(1+tol)+slack:
			verdict = "GROWS"
			t.Errorf("%s grows: %.1f -> %.1f (more than %.0f%% + %.0f)", name, a, b, 100*tol, slack)
		}
		trends = append(trends, fmt.Sprintf("| %s | %.1f | %.1f | %+.1f%% | %.1f | %s |", name, a, b, 100*(b-a)/a, a*(1+tol)+slack, verdict))
	}
	check("heap floor (after GC), MiB", floor(mid)/(1<<20), floor(end)/(1<<20), 4)
	check("OS threads (mean)", mean(mid, func(p point) float64 { return p.threads }), mean(end, func(p point) float64 { return p.threads }), 4)
	check("open fds (mean)", mean(mid, func(p point) float64 { return p.fds }), mean(end, func(p point) float64 { return p.fds }), 16)
	gMid, gEnd := goroutineReadings(mid), goroutineReadings(end)
	t.Logf("goroutine readings (pprof, every %s): middle third %d (min %.0f, max %.0f), last third %d (min %.0f, max %.0f)",
		harness.GoroutineEvery, len(gMid), minOf(gMid), maxOf(gMid), len(gEnd), minOf(gEnd), maxOf(gEnd))
	if len(gMid) < 3 || len(gEnd) < 3 {
		t.Errorf("goroutines: only %d and %d readings in the middle and last thirds", len(gMid), len(gEnd))
	}
	// Under this load the goroutine count follows the connections in
	// flight (one or two per HTTP connection: from about 20 when the
	// throttle is Open and the generator's connections have drained, to
	// several hundred when it admits), so the median of a third moves with
	// the shedding cycle by far more than a leak would. A leaked goroutine
	// never exits: it raises the floor (10th percentile) of the readings,
	// the troughs between bursts, as a leak of memory raises the heap
	// floor. The floor is asserted; the median is reported.
	tol = *soakGorTol
	// Allowed: max(tol*a, 20); the slack is what 20 exceeds tol*a by.
	gf := floorOf(gMid)
	check("goroutines floor (10th percentile)", gf, floorOf(gEnd), max(0, soakGorSlack-tol*gf))
	gm, ge := median(gMid), median(gEnd)
	t.Logf("goroutines (median, reported, not asserted): middle third %.1f, last third %.1f (%+.1f%%)", gm, ge, 100*(ge-gm)/gm)
	trends = append(trends, fmt.Sprintf("| goroutines (median) | %.1f | %.1f | %+.1f%% | not asserted | - |", gm, ge, 100*(ge-gm)/gm))

	// 3. Throttle counters against the generator, per signal, over HTTP:
	// every request the generator got an answer to was decided once.
	if len(sum.final) == 0 {
		t.Fatal("no final scrape of the collector's metrics")
	}
	var gen loadgen.Snapshot
	if k := len(sum.points); k > 0 {
		gen = sum.points[k-1].lg
	}
	for _, sig := range []struct {
		name string
		s    loadgen.Signal
	}{{"traces", loadgen.Traces}, {"metrics", loadgen.Metrics}} {
		allowed, _ := sumSamples(sum.final, "otelcol_throttle_requests", map[string]string{"protocol": "http", "signal": sig.name, "decision": "allowed"})
		denied, _ := sumSamples(sum.final, "otelcol_throttle_requests", map[string]string{"protocol": "http", "signal": sig.name, "decision": "denied"})
		g := gen.PerSignal[sig.s]
		answered := g.OK + g.Rejected + g.Unavailable + g.Other
		t.Logf("%s over http: throttle allowed %.0f + denied %.0f = %.0f; generator sent %d, answered %d (2xx %d, 429 %d), transport errors %d",
			sig.name, allowed, denied, allowed+denied, g.Sent, answered, g.OK, g.Rejected, g.Errors)
		// A transport error may or may not have reached the collector.
		if d := allowed + denied - float64(answered); d < 0 || d > float64(g.Errors) {
			t.Errorf("%s: throttle decided %.0f requests, the generator got %d answers (+%d errors)", sig.name, allowed+denied, answered, g.Errors)
		}
		if float64(g.Rejected) != denied {
			t.Errorf("%s: %d 429s seen by the generator, %.0f denials counted", sig.name, g.Rejected, denied)
		}
	}
	grpc, _ := sumSamples(sum.final, "otelcol_throttle_requests", map[string]string{"protocol": "grpc"})
	if grpc != 0 {
		t.Errorf("%.0f gRPC decisions counted; the generator sent none", grpc)
	}
}

// goroutineReadings returns the distinct goroutine readings of ps (one
// reading every harness.GoroutineEvery spans several points).
func goroutineReadings(ps []point) []float64 {
	var v []float64
	var last time.Time
	for _, p := range ps {
		if p.goroutines >= 0 && !p.goroutinesAt.Equal(last) {
			v = append(v, p.goroutines)
			last = p.goroutinesAt
		}
	}
	return v
}

// floorOf is the 10th percentile of v (NaN when empty).
func floorOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/10]
}

func minOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return slices.Min(v)
}

func maxOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return slices.Max(v)
}

// writeTrends writes the soak's trend figures for the run's report.
func writeTrends(path string, rows []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Soak trends, load phase, middle third -> last third:\n\n")
	fmt.Fprintln(&b, "| figure | middle third | last third | change | allowed up to | verdict |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintln(&b, r)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func sumSamples(s []harness.Sample, name string, want map[string]string) (float64, bool) {
	return harness.Sum(s, name, want)
}
