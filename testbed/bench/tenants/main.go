// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command tenants measures fairness per tenant: ten tenants' agents
// send to a gateway, one of them at ten times the others' rate, behind a
// real proxy that hides their addresses and without it.
//
//	loadgen ──► agent 1..10 ──► tap ──► HAProxy ───────────► gateway ──otlp_http──► sink
//	(tenant-N   (stock:          (this    (HTTP mode,          (in a cgroup)          (this process:
//	 in the      otlp → batch →   process: X-Forwarded-For,                            spans per tenant)
//	 resource)   otlp_http with   from the  from 127.0.0.20)
//	             x-tenant: N)     tenant's
//	                              address)
//
// Each tenant is a stock collector agent (the fleet's otelcol-stock)
// whose otlp_http exporter sends its tenant in a header (x-tenant:
// tenant-N), fed by a load generator at a fixed rate whose items carry the
// tenant in a resource attribute; the last tenant is the noisy one, at
// -noisy-factor times the others' rate. The gateway exports to a sink in
// this process that counts the spans of each tenant. Between each agent
// and the gateway a tap in this process forwards every export from the
// tenant's own loopback address (127.0.0.2, .3, ...: collector exporters
// cannot choose theirs) and records how the gateway answered it and how
// long it took.
//
// Topologies (-topologies): proxy, the taps send to HAProxy in HTTP mode,
// which adds X-Forwarded-For and reaches the gateway from 127.0.0.20
// alone, reusing its connections for every tenant, as an ingress or an L7
// balancer does; direct, each tap sends to the gateway from its tenant's
// address. Gateways (-gateways), each in a cgroup of -cpus and -mem-mib:
//
//	throttle-address    otelcol-throttle, the shipped defaults (fairness key: the client's address)
//	throttle-tenant     fairness: { key: header, header: x-tenant }
//	throttle-forwarded  fairness: { key: address, trusted_proxies: [127.0.0.20] } (behind the proxy only)
//	stock               otelcol-stock, no protection
//	mlext               core's memory_limiter extension, v0.159.0 (the fleet's otelcol-mlext)
//
// First it measures the gateway's capacity as the fleet does (the stock
// gateway with memory enough not to matter, every tenant alike, stepped up
// until the sink's rate stops growing, the best step offered again to a
// fresh gateway), unless -capacity is given. A quiet tenant's rate is
// -load times the capacity over the tenants, so that the ten at their
// normal rate take -load of it. Then for every gateway in every topology,
// on fresh processes each: a baseline round, the nine quiet tenants only,
// and a noisy round, with the noisy tenant too; each a -warmup, a load
// window of -round and the drain (until the quiet tenants' agents have
// settled everything, at most -drain-max). The quiet tenants' figures are
// compared pairwise, round against round, in the same run: their
// acceptance (the share of the spans their agents sent, retries included,
// that the gateway accepted), their spans delivered over the load window,
// what they lost, and the p99 latency of their accepted exports (timed by
// the taps); the noisy tenant's refusals by status and Retry-After; the
// gateway's OOM kills and peak working set, and the machine's busy share
// beside every round.
//
// Linux, root (cgroups), HAProxy (Debian: apt-get install haproxy). Its
// default paths are relative to the repository root: make tenants builds
// it into bin/tenants and runs it there, writing bench/runs/<date>-tenants
// (git-ignored): report.md, summary.csv, a chart, results.json (-report
// reads it back), timeline.csv, exports.csv (every export the taps saw),
// and the configurations and logs. make promote takes a run as the
// baseline.
//
//	make tenants                                       # everything (about 25 minutes)
//	make tenants TENANTS_FLAGS='-topologies proxy -gateways throttle-tenant,throttle-address -round 20s'
//	bin/tenants -capacity 12000 -round 30s
//	bin/tenants -report bench/runs/<run>               # regenerate a run's report
//
// It stops by itself (every phase is bounded, the run has a deadline),
// and stops what it started, by PID, and removes its cgroups, also on
// error or Ctrl-C.
package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// The files of a run.
const (
	timelineFile = "timeline.csv"
	exportsFile  = "exports.csv"
	resultsFile  = "results.json"
	setupFile    = "setup.json"
	capacityFile = "capacity.md"
	summaryFile  = "summary.csv"
	reportFile   = "report.md"
	machineFile  = "machine.txt"
)

type options struct {
	throttleBin, stockBin, mlextBin, haproxyBin string
	out, name                                   string
	gateways                                    []gateway
	topologies                                  []string
	tenants                                     int
	noisyFactor                                 float64
	load                                        float64
	cpus                                        float64
	memMiB                                      uint64
	capacity                                    float64
	capSteps                                    harness.CapacitySteps
	warmup, round, drainMax, settle             time.Duration
	interval                                    time.Duration
	spans, attrSize                             int
	agentCompression                            string
	report                                      string
	// set lists the flags given on the command line.
	set []string
}

// defaultOptions are the flags' defaults, also used by the tests.
func defaultOptions() options {
	return options{
		stockBin: "_build/stock/otelcol-stock", throttleBin: "_build/otelcol-throttle", mlextBin: "_build/mlext/otelcol-mlext",
		haproxyBin: "haproxy", name: "tenants", gateways: gateways, topologies: topologies,
		tenants: 10, noisyFactor: 10, load: 0.8, cpus: 0.1, memMiB: 200,
		capSteps: harness.CapacitySteps{Start: 4000, Growth: 1.25, MaxSteps: 14, Step: 10 * time.Second},
		warmup:   5 * time.Second, round: 40 * time.Second, drainMax: 30 * time.Second, settle: 3 * time.Second,
		interval: time.Second, spans: 200, attrSize: 256,
		// The agents send uncompressed: gzip would cost them about what it
		// costs the gateway, on the two cores they share with it.
		agentCompression: "none",
	}
}

func main() {
	o := defaultOptions()
	flag.StringVar(&o.throttleBin, "throttle", o.throttleBin, "otelcol-throttle binary (make otelcol)")
	flag.StringVar(&o.stockBin, "stock", o.stockBin, "otelcol-stock binary: the agents and the stock gateway (make otelcol-stock)")
	flag.StringVar(&o.mlextBin, "mlext", o.mlextBin, "otelcol-mlext binary: the memory_limiter extension gateway (make otelcol-mlext)")
	flag.StringVar(&o.haproxyBin, "haproxy", o.haproxyBin, "the HAProxy binary (Debian: apt-get install haproxy)")
	flag.StringVar(&o.out, "out", "", "results folder (default "+harness.RunsDir+"/<UTC date>-<name>, git-ignored; make promote makes a run the baseline)")
	flag.StringVar(&o.name, "name", o.name, "name of the run's folder under "+harness.RunsDir+" (without -out)")
	flag.Func("gateways", "comma-separated gateways: throttle-address, throttle-tenant, throttle-forwarded, stock, mlext, or all (default all)", func(s string) (err error) {
		o.gateways, err = parseGateways(s)
		return err
	})
	flag.Func("topologies", "comma-separated topologies: proxy (HAProxy in HTTP mode in front of the gateway), direct (each tenant from its own address), or all (default all)", func(s string) (err error) {
		o.topologies, err = parseTopologies(s)
		return err
	})
	flag.IntVar(&o.tenants, "tenants", o.tenants, "number of tenants, the last one noisy")
	flag.Float64Var(&o.noisyFactor, "noisy-factor", o.noisyFactor, "the noisy tenant's rate, in quiet tenants' rates")
	flag.Float64Var(&o.load, "load", o.load, "the share of the gateway's capacity the tenants take at their normal rate, all together")
	flag.Float64Var(&o.cpus, "cpus", o.cpus, "CPU quota of the gateway's cgroup, cores")
	flag.Uint64Var(&o.memMiB, "mem-mib", o.memMiB, "memory limit of the gateway's cgroup, MiB")
	flag.Float64Var(&o.capacity, "capacity", 0, "the gateway's capacity in spans/s (0: measure it first)")
	flag.Float64Var(&o.capSteps.Start, "capacity-start", o.capSteps.Start, "first offered rate of the capacity measurement, spans/s")
	flag.Float64Var(&o.capSteps.Growth, "capacity-growth", o.capSteps.Growth, "factor between two steps of the capacity measurement")
	flag.IntVar(&o.capSteps.MaxSteps, "capacity-max-steps", o.capSteps.MaxSteps, "most steps of the capacity measurement")
	flag.DurationVar(&o.capSteps.Step, "capacity-step", o.capSteps.Step, "duration of each capacity step")
	flag.DurationVar(&o.warmup, "warmup", o.warmup, "warmup of each round at the tenants' rates, before the load window")
	flag.DurationVar(&o.round, "round", o.round, "the load window of each round")
	flag.DurationVar(&o.drainMax, "drain-max", o.drainMax, "longest drain after a round's load (the quiet tenants' agents settling)")
	flag.DurationVar(&o.settle, "settle", o.settle, "the drain ends once the quiet tenants' agents and their spans at the sink have not moved for this long")
	flag.DurationVar(&o.interval, "interval", o.interval, "sampling interval of the timeline")
	flag.IntVar(&o.spans, "spans", o.spans, "spans per load generator request (the agents batch them)")
	flag.IntVar(&o.attrSize, "attr-size", o.attrSize, "attribute bytes per span")
	flag.StringVar(&o.agentCompression, "agent-compression", o.agentCompression, "the agents' exporter compression (none, gzip, ...; \"\": the exporter's default, gzip)")
	flag.StringVar(&o.report, "report", "", "only (re)generate the report of this results folder, and exit")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { o.set = append(o.set, f.Name) })
	if o.report != "" {
		if err := writeReport(o.report); err != nil {
			fmt.Fprintln(os.Stderr, "tenants: report:", err)
			os.Exit(1)
		}
		fmt.Println("report:", filepath.Join(o.report, reportFile))
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "tenants:", err)
		os.Exit(1)
	}
}

// check checks the options.
func (o options) check() error {
	var errs []error
	if o.tenants < 2 || o.tenants > maxTenants {
		errs = append(errs, fmt.Errorf("-tenants must be between 2 and %d (their addresses are 127.0.0.2 to 127.0.0.%d)", maxTenants, maxTenants+1))
	}
	if o.noisyFactor <= 0 || o.load <= 0 || o.cpus <= 0 || o.memMiB == 0 {
		errs = append(errs, errors.New("-noisy-factor, -load, -cpus and -mem-mib must be > 0"))
	}
	if o.round <= 0 || o.warmup < 0 || o.drainMax <= 0 || o.settle <= 0 || o.interval <= 0 {
		errs = append(errs, errors.New("-round, -drain-max, -settle and -interval must be > 0, -warmup >= 0"))
	}
	if o.spans < 1 || o.attrSize < 0 {
		errs = append(errs, errors.New("-spans must be >= 1 and -attr-size >= 0"))
	}
	if len(pairs(o.topologies, o.gateways)) == 0 {
		errs = append(errs, errors.New("-gateways and -topologies leave nothing to run (throttle-forwarded runs behind the proxy only)"))
	}
	if o.capacity <= 0 {
		errs = append(errs, o.capSteps.Check())
	}
	return errors.Join(errs...)
}

// prepare checks the machine, the options and the binaries, creates the
// run's folder and writes machine.txt.
func (o *options) prepare() error {
	if runtime.GOOS != "linux" {
		return errors.New("needs Linux cgroups")
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root to create cgroups")
	}
	if err := o.check(); err != nil {
		return err
	}
	bins := map[string]bool{o.stockBin: true}
	for _, g := range o.gateways {
		bins[o.binFor(g.kind)] = true
	}
	for b := range bins {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("binary %s: %w (make otelcol otelcol-stock otelcol-mlext)", b, err)
		}
	}
	for _, p := range []*string{&o.stockBin, &o.throttleBin, &o.mlextBin} {
		*p, _ = filepath.Abs(*p)
	}
	if slices.Contains(o.topologies, topoProxy) {
		var err error
		if o.haproxyBin, err = haproxy.Find(o.haproxyBin); err != nil {
			return err
		}
	}
	var err error
	if o.out, err = harness.RunDir(".", o.out, cmp.Or(o.name, "tenants"), time.Now()); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, machineFile), []byte(harness.MachineInfo(os.Args)), 0o644)
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

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s tenants: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// writeJSON writes v to path, indented.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// readJSON reads path into v.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
