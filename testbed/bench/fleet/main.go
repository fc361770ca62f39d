// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command fleet runs the fleet benchmark: a gateway under test behind stock
// collectors acting as agents, as users run them, exporting to a sink
// collector, through a burst at twice the gateway's capacity and the drain
// that follows.
//
//	loadgen ──► agent 1..N ──otlp_http / otlp_grpc──► gateway ──otlp_http──► sink
//	            (stock: otlp → batch → exporter       (in a cgroup:          (stock: otlp → nop;
//	             with gzip, sending_queue, retry)      0.3 CPU, 150 MiB)      its accepted count
//	                                                                          is the ground truth)
//
// First it measures the gateway's capacity in the same run: the stock
// gateway, with memory enough not to matter, fed through the agents at a
// rate stepped up until the rate the sink receives stops growing; the
// capacity is the rate of the best step measured again on a fresh fleet
// (see measureCapacity). Then,
// per scenario, a fresh sink, gateway and agents; a short warmup at a
// fifth of the capacity; the burst, an open loop at -factor times the
// capacity for -burst; then the drain, until every agent has sent or
// given up on everything it accepted, every queue is empty and the sink
// has not moved for -settle (at most -drain-max). The timeline also
// records how busy the whole machine was: the agents, the sink and the
// generator share its cores with the gateway.
//
// Scenarios (-scenarios): reference (the stock gateway with 1 GiB; see
// referenceScenario), stock (no protection), memory_limiter (the
// processor), mlext (core's memory_limiter extension as middleware, built
// from v0.159.0), throttle (the shipped defaults); each also with the suffix
// +gomemlimit, which sets GOMEMLIMIT to -gomemlimit-pct of the memory limit
// as the Helm chart does.
//
// The agents all reach the gateway from 127.0.0.1, one peer to it, as
// clients behind one sidecar, proxy or NAT do; with -distinct-addresses
// each agent goes through a relay from its own loopback address, one peer
// per agent, as agents on distinct nodes.
//
// Every 250 ms it records the gateway's cgroup (working set, CPU, OOM
// kills), whether it is alive (a dead gateway is restarted after
// -restart-delay and counted, as a kubelet would), the gateway's, agents'
// and sink's own metrics and the load generator's counts, into
// timeline.csv; per scenario a row of summary.csv and summary.md; at the
// end the report (bench/report): report.md and timeline-<scenario>.png.
// Linux, root. Every phase is bounded and the run stops by itself; it
// stops what it started, by PID, and removes its cgroups, also on error or
// Ctrl-C.
//
// With -tier N it runs the tier instead (tier.go): N gateways of each
// kind behind HAProxy in TCP mode with round-robin, as a replica set
// behind a Kubernetes Service, one of them with half the CPU of the
// others, against the summed capacity of the replicas, round by round.
//
// With -tier N -autoscale cpu,demand it replays Kubernetes' HPA against
// the tier instead (autoscale.go, hpa.go): from one ready replica of N
// equal ones, under a sustained load of 2.5 replicas' capacity, once per
// signal, to see which brings the tier to the replicas it needs sooner and
// whether anything is lost on the way.
//
// Its default paths are relative to the repository root: make fleet builds
// it into bin/fleet and runs it there (make tier with -tier 3, make
// autoscale with -tier 3 -autoscale cpu,demand).
//
//	make fleet                                   # everything, over HTTP
//	make fleet FLEET_FLAGS='-protocol grpc'      # agents exporting over gRPC
//	bin/fleet -scenarios throttle -capacity 30000
//	bin/fleet -scenarios throttle -capacity 30000 -distinct-addresses
//	bin/fleet -report bench/runs/<run>
//
// A backend that hangs or is slow (the gateway with 1 GiB, at its capacity,
// a queue of 100 batches; throttle+downstream is throttle with its
// downstream level):
//
//	bin/fleet -scenarios stock,throttle,throttle+downstream -capacity 9688 -factor 1 -mem-mib 1024 \
//	  -queue-size 100 -burst 90s -backend-hang 60s -backend-hang-at 20s
//	bin/fleet -scenarios stock,throttle,throttle+downstream -capacity 9688 -factor 1 -mem-mib 1024 \
//	  -queue-size 100 -burst 60s -backend-rate 1200000
//
// A run goes to bench/runs/<UTC date>-<name> (git-ignored; the name
// defaults to fleet-http or fleet-grpc) unless -out says otherwise; make
// promote copies one into its baseline in bench/results.
//
//	make tier                                    # the tier, over HTTP
//	make tier TIER_FLAGS='-protocol grpc -scenarios throttle,throttle+age=30s'
//	bin/fleet -tier 3 -tier-capacity 13000,13000,6500 -rounds 1 -factor 1.5
//	make autoscale                               # the HPA replay, over HTTP
//	make autoscale AUTOSCALE_FLAGS='-protocol grpc'
//	bin/fleet -tier 3 -autoscale cpu,demand -tier-capacity 13000,13000,13000 -rounds 1
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
)

type options struct {
	stockBin, throttleBin, mlextBin string
	out                             string
	name                            string
	scenarios                       string
	protocol                        string
	agentCompression                string
	agents                          int
	distinctAddrs                   bool
	cpus                            float64
	memMiB                          uint64
	capacity                        float64
	capStart, capGrowth             float64
	capMaxSteps                     int
	capStep                         time.Duration
	factor                          float64
	warmup                          time.Duration
	burst                           time.Duration
	drainMax                        time.Duration
	settle                          time.Duration
	spans, attrSize                 int
	restartDelay                    time.Duration
	interval                        time.Duration
	gomemlimitPct                   float64
	throttleYAML                    string
	// backendHang stops the sink (SIGSTOP) for this long, backendHangAt
	// into the burst, as a backend that hangs (0: never).
	backendHang, backendHangAt time.Duration
	// queueSize is the gateway exporter's queue_size (0: its default).
	queueSize int
	// backendRate bounds the bytes/s the gateway's exporter sends to the
	// sink, a slow backend (0: none).
	backendRate int
	// profile: a CPU profile of the gateway of this many seconds, taken
	// profileAt into the burst (0: none).
	profile, profileAt time.Duration
	report             string
	// factors is -factor as given (the fleet takes one, the tier a list).
	factors []float64
	// bench names the benchmark in the names of its cgroups: fleet or tier.
	bench     string
	tier      tierOptions
	autoscale autoscaleOptions
	// set lists the flags given on the command line.
	set []string
}

// defaultOptions are the flags' defaults, also used by the tests.
func defaultOptions() options {
	return options{
		stockBin: "_build/stock/otelcol-stock", throttleBin: "_build/otelcol-throttle", mlextBin: "_build/mlext/otelcol-mlext",
		scenarios: "all", protocol: "http", agents: 4, cpus: 0.3, memMiB: 150,
		capStart: 4000, capGrowth: 1.25, capMaxSteps: 14, capStep: 10 * time.Second, factor: 2,
		warmup: 5 * time.Second, burst: 60 * time.Second, drainMax: 6 * time.Minute, settle: 10 * time.Second,
		spans: 200, attrSize: 256, restartDelay: time.Second, interval: 250 * time.Millisecond, gomemlimitPct: 80,
		backendHangAt: 20 * time.Second, bench: "fleet", tier: defaultTierOptions(),
	}
}

func main() {
	o := defaultOptions()
	flag.StringVar(&o.stockBin, "stock", o.stockBin, "otelcol-stock binary: agents, sink, stock gateways (make otelcol-stock)")
	flag.StringVar(&o.throttleBin, "throttle", o.throttleBin, "otelcol-throttle binary (make otelcol)")
	flag.StringVar(&o.mlextBin, "mlext", o.mlextBin, "otelcol-mlext binary: the memory_limiter extension gateway (make otelcol-mlext)")
	flag.StringVar(&o.out, "out", "", "results folder (default "+harness.RunsDir+"/<UTC date>-<name>, git-ignored; make promote makes a run the baseline)")
	flag.StringVar(&o.name, "name", "", "name of the run's folder under "+harness.RunsDir+" (without -out; default fleet-<protocol>)")
	flag.StringVar(&o.scenarios, "scenarios", o.scenarios, "comma-separated scenarios: stock, memory_limiter, mlext, throttle, each optionally with +gomemlimit, and reference (stock with 1 GiB, the capacity measurement's memory); all = every one of them")
	flag.StringVar(&o.protocol, "protocol", o.protocol, "the agents' exporter: http (otlp_http) or grpc (otlp_grpc)")
	flag.IntVar(&o.agents, "agents", o.agents, "number of agents")
	flag.StringVar(&o.agentCompression, "agent-compression", "", "the agents' exporter compression (default: the exporter's, gzip; none: uncompressed)")
	flag.BoolVar(&o.distinctAddrs, "distinct-addresses", false, "each agent reaches the gateway from its own loopback address (127.0.0.11, .12, ...) through a relay, one peer per agent as on distinct nodes; default: all from 127.0.0.1, one peer, as behind one sidecar or proxy")
	flag.Float64Var(&o.cpus, "cpus", o.cpus, "CPU quota of the gateway's cgroup, cores")
	flag.Uint64Var(&o.memMiB, "mem-mib", o.memMiB, "memory limit of the gateway's cgroup, MiB")
	flag.Float64Var(&o.capacity, "capacity", 0, "the gateway's capacity in spans/s (0: measure it first)")
	flag.Float64Var(&o.capStart, "capacity-start", o.capStart, "first offered rate of the capacity measurement, spans/s")
	flag.Float64Var(&o.capGrowth, "capacity-growth", o.capGrowth, "factor between two steps of the capacity measurement")
	flag.IntVar(&o.capMaxSteps, "capacity-max-steps", o.capMaxSteps, "most steps of the capacity measurement")
	flag.DurationVar(&o.capStep, "capacity-step", o.capStep, "duration of each capacity step")
	flag.Func("factor", "burst rate as a multiple of the capacity (default 2); with -tier a list, every factor a run of each scenario per round (default 1,1.5)", func(s string) (err error) {
		o.factors, err = parseList(s, "-factor", strconv.ParseFloat)
		return err
	})
	flag.DurationVar(&o.warmup, "warmup", o.warmup, "warmup at a fifth of the capacity before the burst")
	flag.DurationVar(&o.burst, "burst", o.burst, "duration of the burst")
	flag.DurationVar(&o.drainMax, "drain-max", o.drainMax, "longest drain after the burst (the exporters give up after 5 min)")
	flag.DurationVar(&o.settle, "settle", o.settle, "the drain ends once the agents are empty and the sink has not moved for this long")
	flag.IntVar(&o.spans, "spans", o.spans, "spans per load generator request (the agents batch them)")
	flag.IntVar(&o.attrSize, "attr-size", o.attrSize, "attribute bytes per span")
	flag.DurationVar(&o.restartDelay, "restart-delay", o.restartDelay, "delay before restarting a dead gateway")
	flag.DurationVar(&o.interval, "interval", o.interval, "sampling interval of the timeline")
	flag.Float64Var(&o.gomemlimitPct, "gomemlimit-pct", o.gomemlimitPct, "GOMEMLIMIT of the +gomemlimit scenarios, % of the memory limit")
	flag.DurationVar(&o.profile, "profile", 0, "take a CPU profile of the gateway of this length in every scenario (pprof extension), -profile-at into the burst")
	flag.DurationVar(&o.profileAt, "profile-at", 20*time.Second, "when in the burst the -profile starts")
	flag.StringVar(&o.report, "report", "", "only (re)generate the report of this results folder, and exit")
	flag.DurationVar(&o.backendHang, "backend-hang", 0, "the backend hangs: the sink stops answering (SIGSTOP) for this long, -backend-hang-at into the burst, then resumes (0: never)")
	flag.DurationVar(&o.backendHangAt, "backend-hang-at", o.backendHangAt, "when in the burst the -backend-hang starts")
	flag.IntVar(&o.backendRate, "backend-rate", 0, "a slow backend: the gateway's exporter reaches the sink through a relay carrying at most this many bytes/s (0: no limit)")
	flag.IntVar(&o.queueSize, "queue-size", 0, "the gateway exporter's sending_queue queue_size, in batches (0: the exporter's default, 1000)")
	throttleFile := flag.String("throttle-config", "", "YAML file with the throttle extension's settings (default: none, the shipped defaults), for experiments")
	tierFlags(&o.tier)
	autoscaleFlags(&o.autoscale)
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { o.set = append(o.set, f.Name) })
	if *throttleFile != "" {
		b, err := os.ReadFile(*throttleFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet:", err)
			os.Exit(2)
		}
		o.throttleYAML = string(b)
	}
	if o.report != "" {
		files, err := report.GenerateFleet(o.report)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet: report:", err)
			os.Exit(1)
		}
		fmt.Printf("report: %s %v\n", files.Markdown, files.PNG)
		return
	}
	runBench := run
	switch {
	case o.tier.replicas > 0 && len(o.autoscale.signals) > 0:
		runBench = runAutoscale
	case o.tier.replicas > 0:
		runBench = runTier
	case len(o.autoscale.signals) > 0:
		fmt.Fprintln(os.Stderr, "fleet: -autoscale replays the HPA on a tier: give -tier N, the most replicas")
		os.Exit(2)
	}
	if err := runBench(o); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// checkCommon checks what the fleet and the tier need alike.
func checkCommon(o options) error {
	if runtime.GOOS != "linux" {
		return errors.New("needs Linux cgroups")
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root to create cgroups")
	}
	if o.protocol != "http" && o.protocol != "grpc" {
		return fmt.Errorf("-protocol %q: want http or grpc", o.protocol)
	}
	if o.agents < 1 {
		return errors.New("-agents must be >= 1")
	}
	if o.backendHang < 0 || o.backendHangAt < 0 || o.queueSize < 0 || o.backendRate < 0 {
		return errors.New("-backend-hang, -backend-hang-at, -backend-rate and -queue-size must be >= 0")
	}
	if o.distinctAddrs && o.agents > 200 {
		return errors.New("-distinct-addresses gives each agent an address from 127.0.0.11: at most 200 agents")
	}
	return nil
}

// checkCapacitySearch checks the capacity measurement's flags.
func checkCapacitySearch(o options) error { return o.capacitySteps().Check() }

// capacitySteps are the capacity measurement's steps.
func (o options) capacitySteps() harness.CapacitySteps {
	return harness.CapacitySteps{Start: o.capStart, Growth: o.capGrowth, MaxSteps: o.capMaxSteps, Step: o.capStep}
}

// parseList parses a comma-separated list of values with parse (a
// strconv.Parse* taking a bit size), naming the flag in its errors.
func parseList[T any](s, flagName string, parse func(string, int) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", flagName, f, err)
		}
		out = append(out, v)
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s fleet: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// scenario is one gateway under test.
type scenario struct {
	name       string
	kind       string // colconfig.KindStock, colconfig.KindMemoryLimiter, colconfig.KindMLExt, colconfig.KindThrottle
	gomemlimit bool
	// downstream turns a throttle gateway's downstream level on.
	downstream bool
	// unlimited gives the gateway memory enough not to matter (see
	// referenceScenario).
	unlimited bool
}

var kinds = []string{colconfig.KindStock, colconfig.KindMemoryLimiter, colconfig.KindMLExt, colconfig.KindThrottle}

// referenceScenario is the stock gateway with the capacity measurement's
// memory (unlimitedMiB) through the same burst and drain as the others.
// Over gRPC agents, whose HTTP/2 flow control bounds what it takes in, that
// memory does not matter, and it shows what the gateway's CPU delivers
// while the burst loads the machine (the agents and the load generator
// share its cores): the capacity, measured at lighter load, is not reached
// in a burst by any gateway. Over HTTP agents the burst OOM-kills it even
// there, so it is no ceiling.
var referenceScenario = scenario{name: "reference", kind: colconfig.KindStock, unlimited: true}

// parseScenarios parses -scenarios.
func parseScenarios(s string) ([]scenario, error) {
	if strings.TrimSpace(s) == "all" {
		out := []scenario{referenceScenario}
		for _, k := range kinds {
			out = append(out, scenario{name: k, kind: k})
		}
		for _, k := range kinds {
			out = append(out, scenario{name: k + "+gomemlimit", kind: k, gomemlimit: true})
		}
		return out, nil
	}
	var out []scenario
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == referenceScenario.name {
			out = append(out, referenceScenario)
			continue
		}
		k, gml := strings.CutSuffix(n, "+gomemlimit")
		k, ds := strings.CutSuffix(k, "+downstream")
		found := false
		for _, kk := range kinds {
			found = found || kk == k
		}
		if !found {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (want %s, each optionally with +gomemlimit, throttle also with +downstream, %s, or all)", n, strings.Join(kinds, ", "), referenceScenario.name)
		}
		if ds && k != colconfig.KindThrottle {
			return nil, fmt.Errorf("-scenarios: %q: +downstream is the throttle's downstream level, for throttle only", n)
		}
		out = append(out, scenario{name: n, kind: k, gomemlimit: gml, downstream: ds})
	}
	return out, nil
}

// prepareRun checks that the binaries of the gateway kinds (and the stock
// collector's) exist and makes every binary's path absolute, creates the
// results folder (-out, or a new run folder named name) and writes the
// machine's description there.
func (o *options) prepareRun(kinds []string, name string) error {
	bins := map[string]bool{o.stockBin: true}
	for _, k := range kinds {
		bins[o.binFor(k)] = true
	}
	for b := range bins {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("binary %s: %w (make otelcol otelcol-stock otelcol-mlext)", b, err)
		}
	}
	for _, p := range []*string{&o.stockBin, &o.throttleBin, &o.mlextBin} {
		*p, _ = filepath.Abs(*p)
	}
	var err error
	if o.out, err = harness.RunDir(".", o.out, name, time.Now()); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, "machine.txt"), []byte(harness.MachineInfo(os.Args)), 0o644)
}

func (o options) binFor(kind string) string {
	switch kind {
	case colconfig.KindThrottle:
		return o.throttleBin
	case colconfig.KindMLExt:
		return o.mlextBin
	}
	return o.stockBin
}

func run(o options) error {
	if err := checkCommon(o); err != nil {
		return err
	}
	switch len(o.factors) {
	case 0:
	case 1:
		o.factor = o.factors[0]
	default:
		return errors.New("-factor: the fleet takes one factor (a list is for -tier)")
	}
	scens, err := parseScenarios(o.scenarios)
	if err != nil {
		return err
	}
	if o.capacity <= 0 {
		if o.backendRate > 0 {
			return errors.New("-backend-rate: give the gateway's -capacity, measured without the slow backend")
		}
		if err := checkCapacitySearch(o); err != nil {
			return err
		}
	}
	kinds := make([]string, len(scens))
	for i, s := range scens {
		kinds[i] = s.kind
	}
	if err := o.prepareRun(kinds, cmp.Or(o.name, "fleet-"+o.protocol)); err != nil {
		return err
	}
	budget := time.Minute
	if o.capacity <= 0 {
		budget += time.Duration(o.capMaxSteps)*(o.capStep+5*time.Second) + remeasureLength(o) + 2*time.Minute
	}
	budget += time.Duration(len(scens)) * (o.warmup + o.burst + o.drainMax + 2*time.Minute)
	ctx, cancel := harness.RunContext(budget)
	defer cancel()
	logf("results in %s; whole run bounded to %s", o.out, budget.Round(time.Second))
	tw, err := harness.CreateCSV(filepath.Join(o.out, "timeline.csv"), timelineHeader)
	if err != nil {
		return err
	}
	defer tw.Close()

	if o.capacity <= 0 {
		c, err := measureCapacity(ctx, o, tw)
		if err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
		o.capacity = c
		logf("capacity of the gateway: %.0f spans/s (-capacity %.0f to reuse it)", c, c)
	}
	var sums []*summary
	for _, s := range scens {
		sum, err := runScenario(ctx, o, s, tw)
		if sum != nil {
			sums = append(sums, sum)
			if err := writeSummaries(o.out, sums); err != nil {
				return err
			}
		}
		if err != nil {
			return fmt.Errorf("scenario %s: %w", s.name, err)
		}
	}
	printSummaries(os.Stdout, sums)
	files, err := report.GenerateFleet(o.out)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	logf("report: %s, %v", files.Markdown, files.PNG)
	return nil
}
