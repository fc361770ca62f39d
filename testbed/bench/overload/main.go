// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command overload runs the otelcol-throttle distribution in a cgroup
// limited to 1 CPU and 300 MiB and loads it with internal/loadgen, in the
// scenarios of the original design's benchmark:
//
//	A  throttle off, below overload (closed loop at the saturating concurrency)
//	B  throttle off, overloaded (open loop, about twice A's saturating rate)
//	C  throttle on, below overload
//	D  throttle on, overloaded
//	M  the stock memory_limiter processor instead of throttle, overloaded
//
// Every 250 ms it records the cgroup's working set and limit, CPU against
// the quota, OOM kills, whether the collector is alive (it restarts a dead
// one and counts restarts, as Kubernetes would), the collector's own metrics
// and the generator's counts, into timeline.csv; per scenario a summary row
// goes into summary.csv and summary.md, and the generator's per-second
// figures into loadgen-<scenario>.csv. Linux, root. At the end it writes
// the report (bench/report): report.md, report.html (charts in SVG),
// timeline-<scenario>.png and chart.csv, plus machine.txt.
//
// Its default paths are relative to the repository root: make overload
// builds it into bin/overload and runs it there.
//
//	bin/overload -mode saturate            # find A's saturation point
//	bin/overload -rate-over 300 -c-below 8  # the scenarios
//	bin/overload -scenarios A,C -rate-below 700  # C against A in open loop below overload
//	bin/overload -report bench/runs/<run>        # regenerate a run's report
//
// A run goes to bench/runs/<UTC date>-<name> (git-ignored) unless -out
// says otherwise; make promote copies one into its baseline in
// bench/results.
//
// It stops by itself (every phase is bounded, the whole run has a deadline)
// and removes its cgroups and stops the processes it started, by PID, also
// on error or Ctrl-C.
package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

type options struct {
	mode        string
	bin         string
	out         string
	scenarios   string
	cpus        float64
	memMiB      uint64
	warmup      time.Duration
	warmupRate  float64
	duration    time.Duration
	cooldown    time.Duration
	cBelow      int
	rateOver    float64
	maxInflight int
	spans       int
	attrSize    int
	signals     string
	protocol    string
	thresholds  string
	// factors: overload factors of the sweep (-factors), as multiples of
	// satRate, A's saturated rate.
	factors      string
	satRate      float64
	restartDelay time.Duration
	interval     time.Duration
	satSteps     string
	satStep      time.Duration
	timeout      time.Duration
	rateBelow    float64
	report       string
	// name names the run's folder under bench/runs (without -out).
	name string
	// throttleConfigs replace -thresholds when set (-throttle-config).
	throttleConfigs []throttleConfig
	// pprof: enable the collector's pprof extension and record its
	// goroutine count every harness.GoroutineEvery (timeline column goroutines).
	pprof bool
	// repeat: rounds of the whole scenario list (-repeat); with more than
	// one, every name gets its round (D@3x-r2) and summary.md the medians.
	repeat int
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "scenarios", "scenarios, or saturate (closed loop steps of concurrency on scenario A)")
	flag.StringVar(&o.bin, "collector", "_build/otelcol-throttle", "collector binary (make otelcol)")
	flag.StringVar(&o.out, "out", "", "results folder (default "+harness.RunsDir+"/<UTC date>-<name>, git-ignored; make promote makes a run the baseline)")
	flag.StringVar(&o.name, "name", "overload", "name of the run's folder under "+harness.RunsDir+" (without -out)")
	flag.StringVar(&o.scenarios, "scenarios", "A,B,C,D,M", "scenarios to run, in order")
	flag.Float64Var(&o.cpus, "cpus", 1, "CPU quota of the cgroup, in cores")
	flag.Uint64Var(&o.memMiB, "mem-mib", 300, "memory limit of the cgroup, MiB")
	flag.DurationVar(&o.warmup, "warmup", 10*time.Second, "warmup phase (open loop at -warmup-rate, 50-item requests)")
	flag.Float64Var(&o.warmupRate, "warmup-rate", 200, "warmup requests/s")
	flag.DurationVar(&o.duration, "d", 60*time.Second, "load phase per scenario")
	flag.DurationVar(&o.cooldown, "cooldown", 5*time.Second, "sampling after the load, before stopping the collector")
	flag.IntVar(&o.cBelow, "c-below", 8, "closed loop concurrency of A and C (the saturation point)")
	flag.Float64Var(&o.rateOver, "rate-over", 0, "open loop requests/s of B, D, M (about 2x A's saturated ok req/s; required for them)")
	flag.IntVar(&o.maxInflight, "max-inflight", 512, "open loop cap of requests in flight")
	flag.IntVar(&o.spans, "spans", 500, "items per request in the load phase")
	flag.IntVar(&o.attrSize, "attr-size", 256, "attribute bytes per item")
	flag.StringVar(&o.signals, "signals", "traces:9,metrics:1", "signal mix (metrics are exempt from throttling)")
	flag.StringVar(&o.protocol, "protocol", "http", "http or grpc")
	flag.StringVar(&o.thresholds, "thresholds", "default", "throttle thresholds: default or benchmark (the original design's), or both (default,benchmark): each throttle scenario then runs once with each")
	flag.StringVar(&o.factors, "factors", "", "the overload sweep: run each overloaded scenario (B, D, M) at each of these multiples of A's saturated rate, e.g. 1.5,2,3,4 (names like D@3x)")
	flag.Float64Var(&o.satRate, "sat-rate", 0, "A's saturated rate in ok req/s, from an earlier run, instead of measuring it (-factors)")
	flag.DurationVar(&o.restartDelay, "restart-delay", time.Second, "delay before restarting a dead collector")
	flag.DurationVar(&o.interval, "interval", 250*time.Millisecond, "sampling interval")
	flag.StringVar(&o.satSteps, "sat-steps", "1,2,4,8,16,32,64", "saturate: concurrency steps")
	flag.DurationVar(&o.satStep, "sat-step", 10*time.Second, "saturate: duration of each step")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Second, "per-request timeout of the generator")
	flag.Float64Var(&o.rateBelow, "rate-below", 0, "open loop requests/s of A and C instead of the closed loop at -c-below (below overload: about 70-80% of A's saturated ok req/s)")
	flag.StringVar(&o.report, "report", "", "only (re)generate the report (report.md, report.html, timeline-*.png, chart.csv) of this results folder, and exit")
	flag.IntVar(&o.repeat, "repeat", 1, "rounds of the whole scenario list, one after another (names get -r1, -r2, ...); summary.md then ends with each scenario's median over the rounds, its goodput as a share of the same round's A: this machine's runs move by 10-20 % from one minute to the next")
	flag.BoolVar(&o.pprof, "pprof", false, "enable the collector's pprof extension on a free localhost port and record its goroutine count every 5 s (timeline column goroutines)")
	throttleFiles := flag.String("throttle-config", "", "YAML files with the throttle extension's settings (replace -thresholds), comma-separated, for experiments: each throttle scenario then runs once with each, named after the file (D@3x+held)")
	flag.Parse()
	var err error
	if o.throttleConfigs, err = readThrottleConfigs(*throttleFiles); err != nil {
		fmt.Fprintln(os.Stderr, "overload: -throttle-config:", err)
		os.Exit(2)
	}
	if o.report != "" {
		files, err := report.Generate(o.report)
		if err != nil {
			fmt.Fprintln(os.Stderr, "overload: report:", err)
			os.Exit(1)
		}
		fmt.Printf("report: %s %s %s %v\n", files.Markdown, files.HTML, files.CSV, files.PNG)
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s overload: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

type scenario struct {
	name          string
	throttle      bool
	memoryLimiter bool
	overload      bool
	// factor, when > 0, is the open-loop rate as a multiple of A's
	// saturated rate (-factors); 0: -rate-over.
	factor float64
	// thresholds overrides -thresholds for this scenario ("" = none).
	thresholds string
	// throttleYAML replaces the thresholds (-throttle-config).
	throttleYAML string
	// round is the scenario's round with -repeat (its name then ends in
	// -r<round>; base is the name without it); 0 without rounds.
	round int
	base  string
}

// throttleConfig is one -throttle-config file: the throttle extension's
// settings, and the name its scenarios get (the file's, without .yaml).
type throttleConfig struct {
	name, yaml string
}

func readThrottleConfigs(files string) ([]throttleConfig, error) {
	var out []throttleConfig
	for _, f := range strings.Split(files, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		if slices.ContainsFunc(out, func(c throttleConfig) bool { return c.name == name }) {
			return nil, fmt.Errorf("two files named %q: their scenarios would share names", name)
		}
		out = append(out, throttleConfig{name: name, yaml: string(b)})
	}
	return out, nil
}

var allScenarios = map[string]scenario{
	"A": {name: "A"},
	"B": {name: "B", overload: true},
	"C": {name: "C", throttle: true},
	"D": {name: "D", throttle: true, overload: true},
	"M": {name: "M", memoryLimiter: true, overload: true},
}

func run(o options) error {
	if runtime.GOOS != "linux" {
		return errors.New("needs Linux cgroups")
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root to create cgroups")
	}
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("collector binary: %w (run make otelcol)", err)
	}
	bin, _ := filepath.Abs(o.bin)
	o.bin = bin
	var scens []scenario
	budget := time.Minute
	steps, err := parseInts(o.satSteps)
	if err != nil {
		return err
	}
	satBudget := time.Duration(len(steps))*(o.satStep+o.timeout+5*time.Second) + 30*time.Second
	if o.mode == "saturate" || o.rateOver <= 0 {
		budget += satBudget
	}
	if o.mode != "saturate" {
		if scens, err = expandScenarios(o); err != nil {
			return err
		}
		budget += time.Duration(len(scens)) * (o.warmup + o.duration + o.cooldown + 2*o.timeout + 30*time.Second)
	}
	if o.out, err = harness.RunDir(".", o.out, o.name, time.Now()); err != nil {
		return err
	}
	// Bounded whatever happens, and Ctrl-C / SIGTERM clean up.
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf("results in %s; whole run bounded to %s", o.out, budget.Round(time.Second))
	if err := os.WriteFile(filepath.Join(o.out, "machine.txt"), []byte(harness.MachineInfo(os.Args)), 0o644); err != nil {
		return err
	}

	tl, err := os.Create(filepath.Join(o.out, "timeline.csv"))
	if err != nil {
		return err
	}
	defer tl.Close()
	tw := csv.NewWriter(tl)
	if err := tw.Write(timelineHeader); err != nil {
		return err
	}
	tw.Flush()

	needRate := false
	for _, s := range scens {
		needRate = needRate || s.overload
	}
	if o.satRate > 0 {
		needRate = false
	}
	if o.mode == "saturate" || (needRate && o.rateOver <= 0) {
		bestC, bestRate, err := saturate(ctx, o, tw)
		if err != nil || o.mode == "saturate" {
			return err
		}
		// The design's load: closed loop at the saturating concurrency below
		// overload, open loop at twice the saturated rate above it.
		o.cBelow, o.rateOver, o.satRate = bestC, 2*bestRate, bestRate
		logf("from the saturation steps: -c-below %d -rate-over %.0f (-sat-rate %.0f)", o.cBelow, o.rateOver, o.satRate)
	}
	if o.rateOver <= 0 && o.satRate > 0 {
		o.rateOver = 2 * o.satRate
	}
	if o.satRate <= 0 && o.rateOver > 0 {
		o.satRate = o.rateOver / 2
	}
	var sums []*summary
	for _, s := range scens {
		sum, err := runScenario(ctx, o, s, tw)
		if sum != nil {
			sums = append(sums, sum)
			if err := writeSummaries(o, sums); err != nil {
				return err
			}
		}
		if err != nil {
			return fmt.Errorf("scenario %s: %w", s.name, err)
		}
	}
	printTables(os.Stdout, o, sums)
	files, err := report.Generate(o.out)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	logf("report: %s, %s, %s, %v", files.Markdown, files.HTML, files.CSV, files.PNG)
	return nil
}

// expandScenarios turns -scenarios, -factors, -thresholds and
// -throttle-config into the list to run: each overloaded scenario once per
// factor (named like D@3x), and each throttle scenario once per thresholds
// value (D@3x+benchmark) or, instead, per -throttle-config file (D@3x+held).
func expandScenarios(o options) ([]scenario, error) {
	var factors []float64
	for _, f := range strings.Split(o.factors, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-factors: bad factor %q", f)
		}
		factors = append(factors, v)
	}
	thresholds := strings.Split(o.thresholds, ",")
	var out []scenario
	for _, n := range strings.Split(o.scenarios, ",") {
		base, ok := allScenarios[strings.TrimSpace(n)]
		if !ok {
			return nil, fmt.Errorf("unknown scenario %q", n)
		}
		variants := []scenario{base}
		if base.overload && len(factors) > 0 {
			variants = nil
			for _, f := range factors {
				v := base
				v.factor = f
				v.name = base.name + "@" + strconv.FormatFloat(f, 'g', -1, 64) + "x"
				variants = append(variants, v)
			}
		}
		for _, v := range variants {
			if v.throttle && len(o.throttleConfigs) > 0 {
				for _, c := range o.throttleConfigs {
					w := v
					w.throttleYAML = c.yaml
					if len(o.throttleConfigs) > 1 {
						w.name += "+" + c.name
					}
					out = append(out, w)
				}
				continue
			}
			if !v.throttle || len(thresholds) < 2 {
				out = append(out, v)
				continue
			}
			for _, th := range thresholds {
				w := v
				w.thresholds = strings.TrimSpace(th)
				if w.thresholds != "default" && w.thresholds != "benchmark" {
					return nil, fmt.Errorf("-thresholds: %q, want default or benchmark", th)
				}
				if w.thresholds != "default" {
					w.name += "+" + w.thresholds
				}
				out = append(out, w)
			}
		}
	}
	if o.repeat < 0 {
		return nil, fmt.Errorf("-repeat: %d, want 1 or more", o.repeat)
	}
	if o.repeat <= 1 {
		return out, nil
	}
	// Rounds of the whole list rather than each scenario N times in a row,
	// so that every round has its own A taken minutes from the others.
	rounds := make([]scenario, 0, o.repeat*len(out))
	for r := 1; r <= o.repeat; r++ {
		for _, s := range out {
			s.base, s.round = s.name, r
			s.name += "-r" + strconv.Itoa(r)
			rounds = append(rounds, s)
		}
	}
	return rounds, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad step %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// env is a collector running in its cgroup, with the recorder sampling it.
type env struct {
	cg      *harness.Cgroup
	col     *harness.Process
	rec     *recorder
	scr     *harness.Scraper
	ports   colConfig
	target  string
	mu      sync.Mutex
	runner  *loadgen.Runner
	recDone chan struct{}
	scrDone chan struct{}
}

func (e *env) setRunner(r *loadgen.Runner) {
	e.mu.Lock()
	e.runner = r
	e.mu.Unlock()
}

func (e *env) getRunner() *loadgen.Runner {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runner
}

// startEnv creates the cgroup, writes the config and starts the collector
// and the sampling. The returned cleanup always runs (it stops what was
// started, by PID, and removes the cgroup), also after an error.
func startEnv(ctx context.Context, o options, s scenario, tw *csv.Writer) (*env, func(), error) {
	e := &env{}
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	name := fmt.Sprintf("throttle-overload-%d-%s", os.Getpid(), s.name)
	cg, err := harness.CreateCgroup(name, o.cpus, o.memMiB<<20)
	if err != nil {
		return nil, cleanup, fmt.Errorf("creating cgroup %s: %w", name, err)
	}
	e.cg = cg
	cleanups = append(cleanups, func() {
		// Anything left in the cgroup was started by this harness (the
		// collector's PID, and only the collector's, lives there).
		for _, pid := range cg.Pids() {
			logf("killing leftover pid %d in %s", pid, name)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := cg.Destroy(); err != nil {
			logf("removing cgroup %s: %v", name, err)
		}
	})
	logf("scenario %s: cgroup v%d %s (%.2g CPU, %d MiB): %v", s.name, cg.Version, name, o.cpus, o.memMiB, cg.Dirs)

	for _, p := range []*int{&e.ports.GRPCPort, &e.ports.HTTPPort, &e.ports.MetricsPort} {
		if *p, err = harness.FreePort(); err != nil {
			return nil, cleanup, err
		}
	}
	e.ports.Throttle, e.ports.MemoryLimiter, e.ports.Thresholds = s.throttle, s.memoryLimiter, o.thresholds
	if s.thresholds != "" {
		e.ports.Thresholds = s.thresholds
	}
	e.ports.ThrottleYAML = s.throttleYAML
	if o.pprof {
		if e.ports.PprofPort, err = harness.FreePort(); err != nil {
			return nil, cleanup, err
		}
	}
	cfg, err := renderConfig(e.ports)
	if err != nil {
		return nil, cleanup, err
	}
	cfgPath, _ := filepath.Abs(filepath.Join(o.out, "config-"+s.name+".yaml"))
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, cleanup, err
	}
	col, err := harness.StartProcess(harness.ProcessConfig{
		Bin: o.bin, Args: []string{"--config", cfgPath}, Cgroup: cg,
		LogPath: filepath.Join(o.out, "collector-"+s.name+".log"), Restart: true, RestartDelay: o.restartDelay, Logf: logf,
	})
	if err != nil {
		return nil, cleanup, err
	}
	e.col = col
	cleanups = append(cleanups, func() { col.Stop(10 * time.Second) })
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", e.ports.MetricsPort)
	if err := harness.WaitReady(ctx, metricsURL, 30*time.Second); err != nil {
		return nil, cleanup, err
	}
	if o.protocol == "grpc" {
		e.target = fmt.Sprintf("127.0.0.1:%d", e.ports.GRPCPort)
	} else {
		e.target = fmt.Sprintf("http://127.0.0.1:%d", e.ports.HTTPPort)
	}

	scr := harness.NewScraper(metricsURL)
	e.scr = scr
	sctx, stopScr := context.WithCancel(context.Background())
	e.scrDone = make(chan struct{})
	go func() { defer close(e.scrDone); scr.Run(sctx, o.interval) }()
	cleanups = append(cleanups, func() { stopScr(); <-e.scrDone })

	var gor *harness.GoroutineScraper
	if e.ports.PprofPort != 0 {
		gor = harness.NewGoroutineScraper(e.ports.PprofPort)
		gctx, stopGor := context.WithCancel(context.Background())
		gorDone := make(chan struct{})
		go func() { defer close(gorDone); gor.Run(gctx, harness.GoroutineEvery) }()
		cleanups = append(cleanups, func() { stopGor(); <-gorDone })
	}

	e.rec = &recorder{
		scenario: s.name, start: time.Now(), cpus: o.cpus, cg: cg, col: col, scr: scr, gor: gor,
		runner: e.getRunner, w: tw, logf: logf,
	}
	rctx, stopRec := context.WithCancel(context.Background())
	e.recDone = make(chan struct{})
	go func() { defer close(e.recDone); e.rec.run(rctx, o.interval) }()
	cleanups = append(cleanups, func() { stopRec(); <-e.recDone })
	return e, cleanup, nil
}

func runScenario(ctx context.Context, o options, s scenario, tw *csv.Writer) (*summary, error) {
	e, cleanup, err := startEnv(ctx, o, s, tw)
	defer cleanup()
	if err != nil {
		return nil, err
	}
	sigs, err := loadgen.ParseSignals(o.signals)
	if err != nil {
		return nil, err
	}
	load := loadgen.Phase{Name: "load", Duration: o.duration, Concurrency: o.cBelow, Items: o.spans, AttrSize: o.attrSize}
	if s.overload {
		load.Rate, load.MaxInflight = o.rateOver, o.maxInflight
		if s.factor > 0 {
			load.Rate = s.factor * o.satRate
		}
	} else if o.rateBelow > 0 {
		load.Rate, load.MaxInflight = o.rateBelow, o.maxInflight
	}
	cfg := loadgen.Config{
		Target: e.target, Protocol: loadgen.Protocol(o.protocol), Signals: sigs, Timeout: o.timeout, GRPCConns: 8,
		CSVPath: filepath.Join(o.out, "loadgen-"+s.name+".csv"),
		Phases: []loadgen.Phase{
			// Open loop at a low rate: a closed loop saturates a 1-CPU
			// collector even at c=2, and warmup must reject nothing.
			{Name: "warmup", Duration: o.warmup, Rate: o.warmupRate, MaxInflight: o.maxInflight, Items: 50, AttrSize: o.attrSize},
			load,
		},
	}
	r, err := loadgen.New(cfg)
	if err != nil {
		return nil, err
	}
	e.setRunner(r)
	lgOut, err := os.Create(filepath.Join(o.out, "loadgen-"+s.name+".txt"))
	if err != nil {
		return nil, err
	}
	defer lgOut.Close()
	st0, _ := e.cg.Stats()
	la0 := harness.LoadAvg()
	rep, runErr := r.Run(ctx, io.MultiWriter(lgOut, os.Stdout))
	e.rec.loadDone.Store(true)
	if runErr == nil {
		select {
		case <-ctx.Done():
			runErr = ctx.Err()
		case <-time.After(o.cooldown):
		}
	}
	stEnd, _ := e.cg.Stats()
	sum := summarize(s, e, rep, st0, stEnd)
	sum.report = rep
	sum.final, _ = e.scr.Get()
	sum.LoadAvgStart, sum.LoadAvgEnd = la0, harness.LoadAvg()
	return sum, runErr
}

// saturate runs scenario A's collector once and steps the closed loop
// concurrency up, printing the goodput of each step.
// It returns the smallest concurrency within 3% of the best goodput, and
// the best rate of successful requests per second.
func saturate(ctx context.Context, o options, tw *csv.Writer) (bestC int, bestRate float64, err error) {
	steps, _ := parseInts(o.satSteps)
	e, cleanup, err := startEnv(ctx, o, scenario{name: "SAT"}, tw)
	defer cleanup()
	if err != nil {
		return 0, 0, err
	}
	sigs, err := loadgen.ParseSignals(o.signals)
	if err != nil {
		return 0, 0, err
	}
	var phases []loadgen.Phase
	for _, c := range steps {
		phases = append(phases, loadgen.Phase{Name: "c=" + strconv.Itoa(c), Duration: o.satStep, Concurrency: c, Items: o.spans, AttrSize: o.attrSize})
	}
	r, err := loadgen.New(loadgen.Config{
		Target: e.target, Protocol: loadgen.Protocol(o.protocol), Signals: sigs,
		Timeout: o.timeout, GRPCConns: 8, Phases: phases, CSVPath: filepath.Join(o.out, "loadgen-SAT.csv"),
	})
	if err != nil {
		return 0, 0, err
	}
	e.setRunner(r)
	rep, runErr := r.Run(ctx, os.Stdout)
	stEnd, _ := e.cg.Stats()
	_, _, restarts := e.col.State()
	fmt.Printf("\nsaturation of scenario A (%d-item requests, %d B attributes, %s):\n", o.spans, o.attrSize, o.protocol)
	fmt.Printf("| c | ok req/s | goodput items/s | p50 | p99 | rejected/errors |\n|---|---|---|---|---|---|\n")
	for _, p := range rep.Phases {
		okps := float64(p.Total.OK) / p.Issuing.Seconds()
		fmt.Printf("| %d | %.1f | %.0f | %s | %s | %d |\n", p.Phase.Concurrency, okps, p.Goodput(),
			p.P50.Round(time.Millisecond), p.P99.Round(time.Millisecond), p.Total.Done()-p.Total.OK)
		bestRate = max(bestRate, okps)
	}
	for _, p := range rep.Phases {
		if float64(p.Total.OK)/p.Issuing.Seconds() >= 0.97*bestRate {
			bestC = p.Phase.Concurrency
			break
		}
	}
	fmt.Printf("OOM kills %d, restarts %d; best %.1f ok req/s, reached at c=%d -> -c-below %d -rate-over %.0f\n",
		stEnd.OOMKills, restarts, bestRate, bestC, bestC, 2*bestRate)
	return bestC, bestRate, runErr
}
