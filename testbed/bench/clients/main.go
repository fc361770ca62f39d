// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command clients runs the client matrix: real OTLP clients
// with their default settings against the otelcol-throttle distribution,
// counting every span from the application to the sink.
//
//	application ─► exporter ──────────────────────────────► gateway ──otlp_grpc──► sink
//	  go-http   Go SDK otlptracehttp                       (otelcol-throttle,       (in this process:
//	  go-grpc   Go SDK otlptracegrpc                        throttle on the otlp     records each span's
//	  js-http   JS exporter-trace-otlp-proto (node)         receiver's gRPC and      client and sequence
//	  js-grpc   JS exporter-trace-otlp-grpc (node)          HTTP servers, in a       number once)
//	  col-http  feeder ─► stock agent's otlp_http           cgroup: 0.5 CPU,
//	  col-grpc  feeder ─► stock agent's otlp_grpc           256 MiB)
//
// Every span carries its client and a sequence number in its trace and
// span IDs (ids.go), so that per client the report has what the
// application handed to the exporter, what the exporter reported as given
// up (and its errors), what arrived at the sink, what is missing and what
// arrived twice. Each client is its own process, each from its own
// loopback address (127.0.0.11, .12, ...; through a relay for the clients
// that cannot bind one: grpc-js and the agents' exporters).
//
// Scenarios (-scenario):
//
//	a  short Opens, repeated: a CPU pulse (a helper in the gateway's CPU
//	   cgroup keeping -burn of the quota busy for -pulse-hold every
//	   -pulse-every) over CPU lines under the quota opens the gateway for a
//	   few seconds (-pulse memory: a helper in its memory cgroup holding
//	   -pulse-target of the limit instead, against the shipped lines);
//	b  an Open of -open (60s): a CPU load in the gateway's CPU cgroup over
//	   CPU lines set under the quota; every client whose whole retry budget
//	   is shorter also runs with the settings that let it wait (+lossless);
//	c  -factor (2)× the gateway's capacity for 5 minutes, shipped defaults
//	   (the capacity is measured first, unless -capacity gives it);
//	d  the admission budget contended by large gzip'd batches (+gzip-large
//	   clients) beside the ordinary ones, shipped defaults;
//	e  the backend hangs for -hang (8s, inside the SDKs' 10 s export
//	   budget) with a gateway queue of 10 batches: throttle with its
//	   downstream level (e), without it (e-throttle), the stock collector
//	   (e-stock);
//	f  the backend is slow for -slow (60s): it takes -slow-share (half) of
//	   what the clients offer, one call at a time, with a gateway queue of
//	   10 batches; the gateways as in e (f, f-throttle, f-stock).
//
// Each scenario writes into its own folder (default
// bench/runs/<date>-clients-<scenario>/, git-ignored): report.md,
// summary.csv, timeline.csv, the chart, every process's configuration, log
// and result. Linux, root. Every phase is bounded; it stops what it
// started, by PID, and removes its cgroup, also on error or Ctrl-C.
//
// Its default paths are relative to the repository root: make clients
// builds what it needs and runs it there.
//
//	make clients                                   # every scenario
//	make clients CLIENTS_FLAGS='-scenario a'
//	bin/clients -scenario c -capacity 30000 -clients go-grpc,col-grpc
//	bin/clients -chart bench/runs/<run>      # draw a run's chart again
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

type options struct {
	throttleBin, stockBin, nodeBin, jsDir string
	// self is this program, started again in a helper role (roleEnv).
	self      string
	out       string
	scenarios []string
	kinds     []string
	cpus      float64
	memMiB    uint64
	// load, rate, workers override the scenarios' (0: theirs).
	load    time.Duration
	rate    float64
	workers int
	// Scenario c.
	capacity     float64
	capacityStep time.Duration
	factor       float64
	// Scenario b.
	openLength time.Duration
	burnShare  float64
	// Scenario a.
	pulse                             string
	pulseFirst, pulseEvery, pulseHold time.Duration
	pulseTarget                       float64
	// Scenario e: how long the backend hangs.
	hang time.Duration
	// Scenario f: how long the backend is slow, and what it takes then,
	// a share of what the clients offer.
	slow                       time.Duration
	slowShare                  float64
	drainMax, settle, interval time.Duration
	args                       []string
	// commit is the checkout's, read when the run starts: the binaries
	// are built from it (make clients rebuilds them first).
	commit string
}

func defaultOptions() options {
	return options{
		throttleBin: "_build/otelcol-throttle", stockBin: "_build/stock/otelcol-stock", nodeBin: "node",
		memMiB: 256, capacityStep: 30 * time.Second, factor: 2,
		openLength: 60 * time.Second, burnShare: 0.8,
		pulse: stressCPU, pulseFirst: 10 * time.Second, pulseEvery: 15 * time.Second, pulseHold: 3 * time.Second, pulseTarget: 0.95,
		hang: 8 * time.Second,
		slow: 60 * time.Second, slowShare: 0.5,
		drainMax: 6 * time.Minute, settle: 5 * time.Second, interval: 250 * time.Millisecond,
	}
}

func main() {
	if childMain() {
		return
	}
	o := defaultOptions()
	scen := flag.String("scenario", "all", "comma-separated scenarios: a, b, c, d, e, e-throttle, e-stock, f, f-throttle, f-stock, or all")
	kinds := flag.String("clients", "all", "comma-separated clients: "+strings.Join(allKinds, ", ")+", or all")
	flag.StringVar(&o.throttleBin, "throttle", o.throttleBin, "otelcol-throttle binary (make otelcol)")
	flag.StringVar(&o.stockBin, "stock", o.stockBin, "otelcol-stock binary: the agents (make otelcol-stock)")
	flag.StringVar(&o.nodeBin, "node", o.nodeBin, "node binary")
	flag.StringVar(&o.jsDir, "js", "", "folder of client.js and its node_modules (default: testbed/bench/clients/js of this checkout)")
	flag.StringVar(&o.out, "out", "", "results folder (default bench/runs/<date>-clients-<scenario>; with several scenarios, one folder each under it)")
	flag.Float64Var(&o.cpus, "cpus", o.cpus, fmt.Sprintf("CPU quota of the gateway's cgroup, cores (0: the scenario's: %g, d %g)", defaultCPUs, contendedCPUs))
	flag.Uint64Var(&o.memMiB, "mem-mib", o.memMiB, "memory limit of the gateway's cgroup, MiB")
	flag.DurationVar(&o.load, "duration", 0, "how long the clients hand spans (0: the scenario's: a 75s, b the Open + 1m, c 5m, d 90s)")
	flag.Float64Var(&o.rate, "rate", 0, "spans/s per client (0: the scenario's)")
	flag.IntVar(&o.workers, "workers", 0, "workers per client, each with one export in flight (0: the scenario's)")
	flag.Float64Var(&o.capacity, "capacity", 0, "scenario c: the gateway's capacity in spans/s (0: measure it first)")
	flag.DurationVar(&o.capacityStep, "capacity-step", o.capacityStep, "scenario c: how long the capacity is measured (over its second half)")
	flag.Float64Var(&o.factor, "factor", o.factor, "scenario c: the load as a multiple of the capacity")
	flag.DurationVar(&o.openLength, "open", o.openLength, "scenario b: how long the CPU load holds the gateway Open")
	flag.Float64Var(&o.burnShare, "burn", o.burnShare, "scenario b: the CPU load, share of the gateway's quota")
	flag.StringVar(&o.pulse, "pulse", o.pulse, "scenario a: what opens the gateway: cpu (a CPU load over CPU lines under the quota) or memory (a helper holding -pulse-target of the memory limit, against the shipped memory lines)")
	flag.DurationVar(&o.pulseFirst, "pulse-first", o.pulseFirst, "scenario a: when the first memory pulse starts")
	flag.DurationVar(&o.pulseEvery, "pulse-every", o.pulseEvery, "scenario a: time between the memory pulses' starts")
	flag.DurationVar(&o.pulseHold, "pulse-hold", o.pulseHold, "scenario a: how long each memory pulse holds")
	flag.Float64Var(&o.pulseTarget, "pulse-target", o.pulseTarget, "scenario a: the working set a pulse brings the cgroup to, share of its limit")
	flag.DurationVar(&o.hang, "hang", o.hang, "scenario e: how long the backend (the sink) hangs, from 20 s into the load")
	flag.DurationVar(&o.slow, "slow", o.slow, "scenario f: how long the backend (the sink) is slow, from 20 s into the load")
	flag.Float64Var(&o.slowShare, "slow-share", o.slowShare, "scenario f: what the slow backend takes, a share of what the clients offer")
	flag.DurationVar(&o.drainMax, "drain-max", o.drainMax, "longest drain after the load (the agents retry for 5 min)")
	flag.DurationVar(&o.settle, "settle", o.settle, "the drain ends once every queue is empty and the sink has not moved for this long")
	chart := flag.String("chart", "", "only draw the chart of this results folder again (from its timeline.csv), and exit")
	flag.Parse()
	if *chart != "" {
		if err := redrawChart(*chart); err != nil {
			fmt.Fprintln(os.Stderr, "clients: chart:", err)
			os.Exit(1)
		}
		return
	}
	var err error
	if o.scenarios, err = parseScenarios(*scen); err == nil {
		o.kinds, err = parseKinds(*kinds)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "clients:", err)
		os.Exit(2)
	}
	o.args = os.Args
	if _, err := runMatrix(o); err != nil {
		fmt.Fprintln(os.Stderr, "clients:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s clients: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// check validates the options and resolves the paths.
func (o *options) check() error {
	if runtime.GOOS != "linux" {
		return errors.New("needs Linux cgroups")
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root to create cgroups")
	}
	if o.cpus < 0 || o.memMiB < 64 || o.pulseTarget <= 0 || o.pulseTarget >= 1 || o.burnShare <= 0 || o.factor <= 0 {
		return errors.New("-burn and -factor must be > 0, -cpus >= 0, -mem-mib >= 64, -pulse-target in (0, 1)")
	}
	if o.pulseEvery <= o.pulseHold || o.openLength <= 0 || o.interval <= 0 || o.hang <= 0 || o.slow <= 0 {
		return errors.New("-pulse-every must exceed -pulse-hold; -open, -hang and -slow must be > 0")
	}
	if !(o.slowShare > 0 && o.slowShare <= 1) {
		return errors.New("-slow-share must be in (0, 1]")
	}
	if o.pulse != stressCPU && o.pulse != stressMemory {
		return fmt.Errorf("-pulse %q: want %s or %s", o.pulse, stressCPU, stressMemory)
	}
	var err error
	if o.self == "" {
		if o.self, err = os.Executable(); err != nil {
			return err
		}
	}
	needs := map[string]bool{"stock": slices.Contains(o.scenarios, "e-stock")}
	for _, k := range o.kinds {
		switch k {
		case jsHTTP, jsGRPC:
			needs["node"] = true
		case colHTTP, colGRPC:
			needs["stock"] = true
		}
	}
	bins := []*string{&o.throttleBin}
	if needs["stock"] {
		bins = append(bins, &o.stockBin)
	}
	for _, b := range bins {
		if _, err := os.Stat(*b); err != nil {
			return fmt.Errorf("binary %s: %w (make otelcol otelcol-stock)", *b, err)
		}
		*b, _ = filepath.Abs(*b)
	}
	if needs["node"] {
		if o.nodeBin, o.jsDir, err = findJS(o.nodeBin, o.jsDir); err != nil {
			return err
		}
	}
	return nil
}

// findJS returns the path of node (nodeBin: a name on PATH or a path) and
// the absolute folder of the JavaScript clients (jsDir, or found from the
// working directory when empty), or an error saying how to get what is
// missing: node, or the packages its package-lock.json pins.
func findJS(nodeBin, jsDir string) (node, dir string, err error) {
	if node, err = exec.LookPath(nodeBin); err != nil {
		return "", "", fmt.Errorf("node: %w (install Node.js and npm)", err)
	}
	if jsDir == "" {
		jsDir = findJSDir()
	}
	if dir, err = filepath.Abs(jsDir); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@opentelemetry", "exporter-trace-otlp-grpc")); err != nil {
		return "", "", fmt.Errorf("the JavaScript clients' packages are not installed in %s: run `npm ci --ignore-scripts` there (make clients-js, make clients and make e2e do): %w", dir, err)
	}
	return node, dir, nil
}

// findJSDir finds testbed/bench/clients/js from the working directory:
// the repository root or any folder of the testbed below it.
func findJSDir() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		for _, rel := range []string{"testbed/bench/clients/js", "bench/clients/js", "clients/js", "js"} {
			p := filepath.Join(d, rel)
			if _, err := os.Stat(filepath.Join(p, "client.js")); err == nil {
				return p
			}
		}
		if filepath.Dir(d) == d {
			return filepath.Join(dir, "testbed/bench/clients/js")
		}
	}
}

// scenarioDir is the results folder of scenario name.
func (o *options) scenarioDir(name string, at time.Time) string {
	switch {
	case o.out == "":
		return filepath.Join("bench", "runs", at.UTC().Format("2006-01-02T1504Z")+"-clients-"+name)
	case len(o.scenarios) == 1:
		return o.out
	}
	return filepath.Join(o.out, name)
}

// budget bounds one scenario's run.
func (o *options) budget(s *scenario) time.Duration {
	longest := time.Duration(0)
	for _, c := range s.clients {
		longest = max(longest, c.exportBudget)
	}
	b := s.load + longest + o.drainMax + 3*time.Minute
	if s.needsCapacity && o.capacity <= 0 {
		b += o.capacityStep + 2*time.Minute
	}
	return b
}

// scenarioRun is one scenario's run: its folder and what it found.
type scenarioRun struct {
	dir      string
	scenario *scenario
	outcome  *runOutcome
	capacity float64
}

// runMatrix runs every scenario of o and writes their reports.
func runMatrix(o options) ([]*scenarioRun, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	o.commit = commit()
	var runs []*scenarioRun
	for _, name := range o.scenarios {
		r, err := runScenario(ctx, o, name, o.scenarioDir(name, started))
		if r != nil {
			runs = append(runs, r)
		}
		if err != nil {
			return runs, fmt.Errorf("scenario %s: %w", name, err)
		}
	}
	return runs, nil
}

// runScenario runs one scenario into dir and writes its report.
func runScenario(ctx context.Context, o options, name, dir string) (*scenarioRun, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	probe, err := buildScenario(name, o, 1)
	if err != nil {
		return nil, err
	}
	if o.cpus == 0 {
		o.cpus = probe.cpus
	}
	ctx, cancel := context.WithTimeout(ctx, o.budget(probe))
	defer cancel()
	r := &scenarioRun{dir: dir, capacity: o.capacity}
	if probe.needsCapacity && r.capacity <= 0 {
		if r.capacity, err = measureCapacity(ctx, o, filepath.Join(dir, "capacity")); err != nil {
			return nil, fmt.Errorf("capacity: %w", err)
		}
		logf("capacity of the gateway: %.0f spans/s (-capacity %.0f to reuse it)", r.capacity, r.capacity)
	}
	if r.scenario, err = buildScenario(name, o, r.capacity); err != nil {
		return nil, err
	}
	logf("scenario %s: %s; results in %s; bounded to %s", name, r.scenario.title, dir, o.budget(r.scenario).Round(time.Second))
	m := &matrix{o: o, s: r.scenario, dir: dir}
	defer m.stop()
	r.outcome, err = m.run(ctx)
	if r.outcome != nil {
		if werr := writeReport(o, r, m); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	return r, err
}

// capacityQueueSize is the gateway exporter's queue_size while its capacity
// is measured, a queue that waits when full (block_on_overflow): the
// receiver answers once the batch processor has the data, so with the
// default queue of 1,000 batches the clients' closed loop bounded nothing
// and the queue grew past 1 GiB on a machine whose clients outran the
// exporter; a small queue that refuses when full drops data the gateway
// spent its CPU on, and measured half the rate the protected gateway then
// delivered. A small queue that waits holds the clients back instead.
const capacityQueueSize = 20

// errCapacityRestarts: the gateway was killed (or restarted) while its
// capacity was measured, so the figure is not its capacity.
var errCapacityRestarts = errors.New("the gateway restarted while its capacity was measured")

// capacityStep is what a capacity step's timeline says: the sink's rate
// over the step's second half, the gateway's mean CPU (% of its quota)
// over it, and how many times the gateway restarted during the step.
type capacityStep struct {
	spansPerSec, cpuPct float64
	restarts            int
}

// capacityOf reads a capacity step of length step from its timeline.
func capacityOf(points []point, step time.Duration) (capacityStep, error) {
	var st capacityStep
	loadStart := -1.0
	for _, p := range points {
		if p.phase == "load" {
			loadStart = p.t
			break
		}
	}
	half, end := loadStart+step.Seconds()/2, loadStart+step.Seconds()
	var atHalf, atEnd, tHalf, tEnd float64 = -1, -1, 0, 0
	var cpuN float64
	for _, p := range points {
		if p.t >= loadStart && p.t < end {
			st.restarts = max(st.restarts, p.restarts)
		}
		if atHalf < 0 && p.t >= half {
			atHalf, tHalf = p.sinkTotal, p.t
		}
		if atEnd < 0 && p.t >= end {
			atEnd, tEnd = p.sinkTotal, p.t
		}
		if p.t >= half && p.t < end && !math.IsNaN(p.cpuPct) {
			st.cpuPct += p.cpuPct
			cpuN++
		}
	}
	if loadStart < 0 || atHalf < 0 || atEnd < 0 || tEnd <= tHalf {
		return st, errors.New("the timeline does not cover the step")
	}
	st.spansPerSec = (atEnd - atHalf) / (tEnd - tHalf)
	st.cpuPct /= max(cpuN, 1)
	return st, nil
}

// measureCapacity measures what the gateway delivers to the sink at most,
// unprotected (throttle enabled: false), with memory not limiting (1 GiB
// and a small exporter queue): the scenario's clients with as many exports
// in flight as they have workers (16) and no pause between them, for
// -capacity-step; the capacity is the sink's rate over the step's second
// half. The gateway's CPU over that half says whether it was the limit
// (near 100% of its quota) or the machine that runs the clients was; a
// restart during the step fails the measurement.
func measureCapacity(ctx context.Context, o options, dir string) (float64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	s := &scenario{
		name: "capacity", title: "capacity",
		throttle:  func(bool) string { return "enabled: false" },
		load:      o.capacityStep,
		queueSize: capacityQueueSize, blockOnOverflow: true,
	}
	for i, k := range o.kinds {
		c := newClient(k, 0, 16)
		c.setID(i + 1)
		s.clients = append(s.clients, c)
	}
	o.memMiB = max(o.memMiB, 1024)
	m := &matrix{o: o, s: s, dir: dir}
	defer m.stop()
	out, err := m.run(ctx)
	if err != nil {
		return 0, err
	}
	st, err := capacityOf(out.Points, o.capacityStep)
	if err != nil {
		return 0, err
	}
	c := st.spansPerSec
	note := fmt.Sprintf("Capacity of the gateway (%.2g CPU, %d MiB and an exporter queue of %d batches that waits when full, so that memory does not limit it, "+
		"throttle enabled: false): %s, 16 workers each exporting 512-span batches back to back, for %s; "+
		"the sink received %.0f spans/s over the second half, while the gateway used %.0f%% of its CPU quota on average; "+
		"it restarted %d times during the step.\n",
		o.cpus, o.memMiB, capacityQueueSize, strings.Join(o.kinds, ", "), o.capacityStep, c, st.cpuPct, st.restarts)
	if err := os.WriteFile(filepath.Join(dir, "capacity.md"), []byte(note), 0o644); err != nil {
		return 0, err
	}
	if st.restarts > 0 {
		return 0, fmt.Errorf("%w (%d times; see %s): give -capacity", errCapacityRestarts, st.restarts, dir)
	}
	if c <= 0 {
		return 0, fmt.Errorf("nothing delivered (see %s)", dir)
	}
	return c, nil
}
