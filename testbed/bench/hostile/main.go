// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command hostile measures what one hostile peer does to the normal
// clients of a gateway protected by throttle, whose admission budget no single client may hold
// or inflate.
//
// The gateway is the otelcol-throttle distribution (make otelcol) with the
// throttle's shipped defaults on the otlp receiver's gRPC and HTTP servers,
// otlp -> batch -> otlp_grpc, in a cgroup of 1 CPU and 512 MiB. Its
// exporter delivers to a sink in this process that takes every batch
// without decoding it (a stock collector as sink would take the machine's
// second core from the clients). Normal clients from 127.0.0.1 send traces
// over OTLP/HTTP (gzip) and gRPC (gzip) in open loop at half the gateway's
// capacity, measured first in the same run (or given with -capacity), and
// record every answer with its time and, for a refusal, its reason. One
// hostile peer at a time, from 127.0.0.2, runs one scenario:
//
//	fill-then-trickle      a gzip body that decompresses to 16 MiB, then one flushed byte every 5 s
//	oversize-gzip          gzip'd bodies of some KiB that decompress to 16 and 64 MiB, back to back
//	oversize-length        a chain of bodies whose Content-Length is the admission budget
//	grpc-inflated-message  a gzip'd gRPC Export of about 4 KiB that decodes to about 4 MB, repeated
//	hold-flood             300 HTTP requests and 300 gRPC streams that send headers and hold their body
//	silent-streams         200 gRPC streams that never send a message, reopened when cancelled
//
// Every scenario round follows a baseline round (no hostile peer) with a
// fresh gateway each, so that the machine's noise is compared pairwise. Per
// scenario the report gives the normal clients' accepted items/s against
// their baseline's (target >= 95 %), their refusals by reason over time,
// the longest stretch of budget refusals (target: none over 2 s), the
// hostile peer's requests refused and admitted, and the gateway's peak
// working set and OOM kills.
//
// The findings of a later review of the fairness by address have one
// scenario each, with a target of their own; some need a gateway of their
// own, which their baseline round gets too (setups.go), and some an honest
// agent from 127.0.1.1 that sends batches of one size one at a time
// (batch.go):
//
//	grpc-shrink            one accepted empty gRPC Export (its peer's calls then reserve 4 KiB), then 600
//	                       concurrent Exports of 4 MB decoded; 1.5 CPU, 1 GiB, a 16 MiB budget; target 0 OOM kills
//	grpc-shrink-control    the same without the empty Export first, for comparison
//	lane-trickle           a gzip body of zeros (20 MiB) in the oversize lane, 23 bytes/s on the wire; honest
//	                       6 MiB batches beside it, one a second; target >= 90 % of them accepted
//	silent-addresses       8 addresses (127.0.0.2-9) with chunked requests that send no body byte, sent again
//	                       when cut; honest 64 KiB batches, a 16 MiB budget; target >= 90 % accepted
//	shutdown               the lane-trickle body and gRPC Exports waiting for bytes with a 5 min deadline, then
//	                       a SIGTERM to the gateway; target: it exits within 10 s
//	lane-allowance-lift    the oversize-gzip peer, and aborted chunked requests from 127.0.0.3, whose reserved
//	                       bytes count as read: the criteria above
//	exempt-overdraft       metrics exempt, 8 addresses sending metrics past the full budget; 1 CPU, 120 MiB
//	                       (auto budget = limit/12); target: reservations <= limit/12, 0 OOM kills
//
// The report gives each round's gateway, its target and the figure it is
// judged by, and the machine's busy share over the load phase.
//
// Linux, root (cgroups). Its default paths are relative to the repository
// root: make hostile builds it into bin/hostile and runs it there, writing
// bench/runs/<date>-hostile/ (git-ignored): report.md, summary.csv,
// summary.md, timeline.csv, answers.csv (every normal answer), hostile.csv
// (every hostile request), two charts, and the gateway's configs and logs.
//
//	bin/hostile                                    # every scenario, 60 s rounds
//	bin/hostile -scenarios fill-then-trickle -d 20s -capacity 20000
//	bin/hostile -report bench/runs/<run>           # regenerate a run's report
//
// It stops by itself (every phase is bounded, the run has a deadline) and
// removes its cgroups and stops the gateways it started, by PID, also on
// error or Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	bin       string
	out       string
	scenarios []string
	repeat    int
	cpus      float64
	memMiB    uint64
	interval  time.Duration
	deadline  time.Duration
	report    string

	// The normal clients.
	capacity    float64 // items/s; 0: measure
	capacityDur time.Duration
	capacityC   int
	loadShare   float64
	items       int
	attrSize    int
	timeout     time.Duration
	maxInflight int
	warmup      time.Duration
	duration    time.Duration

	// The hostile peers.
	trickleMiB    int
	trickleEvery  time.Duration
	trickleConns  int
	bombMiB       []int
	bombLanes     int
	lengthFactor  float64
	lengthRateMiB float64
	inflateBytes  int
	inflateRate   float64
	floodHTTP     int
	floodGRPC     int
	silentStreams int

	// The findings' scenarios (setups.go).
	shrinkCalls      int
	shrinkConns      int
	shrinkEvery      time.Duration
	shrinkTimeout    time.Duration
	laneMiB          int
	laneHeadMiB      int
	laneRate         int
	laneBatchMiB     int
	laneBatchEvery   time.Duration
	silentAddresses  int
	silentConns      int
	silentBatchKiB   int
	silentBudget     string
	shutdownAfter    time.Duration
	shutdownGrace    time.Duration
	shutdownStreams  int
	shutdownDeadline time.Duration
	liftConns        int
	exemptAddresses  int
	exemptConns      int
	exemptKiB        int
}

// defaultOptions are the full run's settings (the flags' defaults).
func defaultOptions() options {
	return options{
		scenarios: hostileScenarios, repeat: 1, cpus: 1, memMiB: 512,
		interval: 250 * time.Millisecond, deadline: 40 * time.Minute,
		capacityDur: 20 * time.Second, capacityC: 8, loadShare: 0.5, items: 100, attrSize: 256,
		timeout: 5 * time.Second, maxInflight: 256, warmup: 5 * time.Second, duration: 60 * time.Second,
		trickleMiB: 16, trickleEvery: 5 * time.Second, trickleConns: 1,
		bombMiB: []int{16, 64}, bombLanes: 2,
		lengthFactor: 1, lengthRateMiB: 4,
		inflateBytes: 4_000_000, inflateRate: 10,
		floodHTTP: 300, floodGRPC: 300, silentStreams: 200,
		shrinkCalls: 600, shrinkConns: 4, shrinkEvery: 25 * time.Second, shrinkTimeout: 10 * time.Second,
		laneMiB: 20, laneHeadMiB: 10, laneRate: 23, laneBatchMiB: 6, laneBatchEvery: time.Second,
		silentAddresses: 8, silentConns: 4, silentBatchKiB: 64, silentBudget: shrinkBudget,
		shutdownAfter: 10 * time.Second, shutdownGrace: 60 * time.Second, shutdownStreams: 20, shutdownDeadline: 5 * time.Minute,
		liftConns:       2,
		exemptAddresses: 8, exemptConns: 4, exemptKiB: 640,
	}
}

func main() {
	o := defaultOptions()
	fs := flag.NewFlagSet("hostile", flag.ExitOnError)
	fs.StringVar(&o.bin, "collector", "_build/otelcol-throttle", "the otelcol-throttle binary (make otelcol)")
	fs.StringVar(&o.out, "out", "", "results folder (default bench/runs/<UTC date>-hostile, -2, -3... when taken)")
	scenarios := fs.String("scenarios", strings.Join(hostileScenarios, ","), "hostile scenarios, in order (each after a baseline round)")
	fs.IntVar(&o.repeat, "repeat", o.repeat, "passes over the scenarios")
	fs.Float64Var(&o.cpus, "cpus", o.cpus, "the gateway cgroup's CPU quota, in cores")
	fs.Uint64Var(&o.memMiB, "mem-mib", o.memMiB, "the gateway cgroup's memory limit, MiB")
	fs.DurationVar(&o.interval, "interval", o.interval, "sampling interval of the timeline")
	fs.DurationVar(&o.deadline, "deadline", o.deadline, "the whole run stops after this")
	fs.StringVar(&o.report, "report", "", "only (re)write the report and charts of this results folder, and exit")
	fs.Float64Var(&o.capacity, "capacity", 0, "the gateway's capacity in items/s, from an earlier run (0: measure it first)")
	fs.DurationVar(&o.capacityDur, "capacity-d", o.capacityDur, "length of the capacity measurement")
	fs.IntVar(&o.capacityC, "capacity-c", o.capacityC, "closed loop requests in flight per protocol in the capacity measurement")
	fs.Float64Var(&o.loadShare, "load", o.loadShare, "the normal clients' load, as a share of the capacity (half over HTTP, half over gRPC)")
	fs.IntVar(&o.items, "items", o.items, "spans per normal request")
	fs.IntVar(&o.attrSize, "attr-size", o.attrSize, "bytes of each span's big attribute")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "a normal request's timeout (the OTLP exporters' default)")
	fs.IntVar(&o.maxInflight, "max-inflight", o.maxInflight, "normal requests in flight per protocol at most (beyond: skipped, counted as errors)")
	fs.DurationVar(&o.warmup, "warmup", o.warmup, "normal load before the hostile peer starts (not measured)")
	fs.DurationVar(&o.duration, "d", o.duration, "the measured load phase of every round")
	fs.IntVar(&o.trickleMiB, "trickle-mib", o.trickleMiB, "fill-then-trickle: MiB the gzip body decompresses to")
	fs.DurationVar(&o.trickleEvery, "trickle-every", o.trickleEvery, "fill-then-trickle: time between two flushed bytes")
	fs.IntVar(&o.trickleConns, "trickle-conns", o.trickleConns, "fill-then-trickle: connections at once")
	bomb := fs.String("bomb-mib", "16,64", "oversize-gzip: MiB each body decompresses to, in turn")
	fs.IntVar(&o.bombLanes, "bomb-lanes", o.bombLanes, "oversize-gzip: connections sending back to back")
	fs.Float64Var(&o.lengthFactor, "length-factor", o.lengthFactor, "oversize-length: Content-Length as a multiple of the admission budget (>= 1)")
	fs.Float64Var(&o.lengthRateMiB, "length-rate", o.lengthRateMiB, "oversize-length: MiB/s each body is sent at")
	fs.IntVar(&o.inflateBytes, "inflate-bytes", o.inflateBytes, "grpc-inflated-message: decoded bytes of the message (under grpc-go's 4 MiB default limit)")
	fs.Float64Var(&o.inflateRate, "inflate-rate", o.inflateRate, "grpc-inflated-message: calls per second")
	fs.IntVar(&o.floodHTTP, "flood-http", o.floodHTTP, "hold-flood: HTTP requests holding their body")
	fs.IntVar(&o.floodGRPC, "flood-grpc", o.floodGRPC, "hold-flood: gRPC streams holding their message")
	fs.IntVar(&o.silentStreams, "silent-streams", o.silentStreams, "silent-streams: streams at once")
	fs.IntVar(&o.shrinkCalls, "shrink-calls", o.shrinkCalls, "grpc-shrink: concurrent Exports of a wave")
	fs.IntVar(&o.shrinkConns, "shrink-conns", o.shrinkConns, "grpc-shrink: connections the waves are spread over")
	fs.DurationVar(&o.shrinkEvery, "shrink-every", o.shrinkEvery, "grpc-shrink: time from one wave's start to the next (the peer's learnt size is forgotten after 10-20 s)")
	fs.DurationVar(&o.shrinkTimeout, "shrink-timeout", o.shrinkTimeout, "grpc-shrink: deadline of each Export")
	fs.IntVar(&o.laneMiB, "lane-mib", o.laneMiB, "lane-trickle: MiB the trickled body decompresses to")
	fs.IntVar(&o.laneHeadMiB, "lane-head-mib", o.laneHeadMiB, "lane-trickle: MiB of it sent at once (beyond its peer's share: it takes the lane)")
	fs.IntVar(&o.laneRate, "lane-rate", o.laneRate, "lane-trickle: bytes per second on the wire after the head")
	fs.IntVar(&o.laneBatchMiB, "lane-batch-mib", o.laneBatchMiB, "lane-trickle: the honest batches' decoded MiB")
	fs.DurationVar(&o.laneBatchEvery, "lane-batch-every", o.laneBatchEvery, "lane-trickle: the least time between two honest batches")
	fs.IntVar(&o.silentAddresses, "silent-addresses", o.silentAddresses, "silent-addresses: attacker addresses (127.0.0.2 on)")
	fs.IntVar(&o.silentConns, "silent-conns", o.silentConns, "silent-addresses: requests at once per address")
	fs.IntVar(&o.silentBatchKiB, "silent-batch-kib", o.silentBatchKiB, "silent-addresses: the honest batches' decoded KiB")
	fs.StringVar(&o.silentBudget, "silent-budget", o.silentBudget, "silent-addresses: the gateway's max_inflight_bytes (auto: the shipped default)")
	fs.DurationVar(&o.shutdownAfter, "shutdown-after", o.shutdownAfter, "shutdown: time into the load phase of the SIGTERM (the round's measured window)")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", o.shutdownGrace, "shutdown: time after the SIGTERM before the gateway is killed")
	fs.IntVar(&o.shutdownStreams, "shutdown-streams", o.shutdownStreams, "shutdown: gRPC Exports waiting for bytes")
	fs.DurationVar(&o.shutdownDeadline, "shutdown-deadline", o.shutdownDeadline, "shutdown: their deadline")
	fs.IntVar(&o.liftConns, "lift-conns", o.liftConns, "lane-allowance-lift: aborted requests at once from the second address")
	fs.IntVar(&o.exemptAddresses, "exempt-addresses", o.exemptAddresses, "exempt-overdraft: attacker addresses (127.0.0.2 on)")
	fs.IntVar(&o.exemptConns, "exempt-conns", o.exemptConns, "exempt-overdraft: connections per address")
	fs.IntVar(&o.exemptKiB, "exempt-kib", o.exemptKiB, "exempt-overdraft: KiB of each metrics body")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	if o.report != "" {
		if err := writeReport(o.report); err != nil {
			fail(err)
		}
		return
	}
	var err error
	if o.scenarios, err = parseScenarios(*scenarios); err != nil {
		fail(err)
	}
	if o.bombMiB, err = parseInts(*bomb); err != nil {
		fail(fmt.Errorf("-bomb-mib: %w", err))
	}
	if err := o.validate(); err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()
	res, err := run(ctx, &o, os.Args)
	if res != nil {
		printTable(os.Stdout, res.rounds)
		fmt.Printf("report: %s\n", res.reportPath)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "hostile:", err)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s hostile: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func parseScenarios(s string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if _, ok := scenarioDescriptions[name]; !ok || name == scenarioBaseline {
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (want some of %s)", name, strings.Join(hostileScenarios, ", "))
		}
		out = append(out, name)
	}
	if len(out) == 0 {
		return nil, errors.New("-scenarios: none given")
	}
	return out, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers, comma-separated", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func (o *options) validate() error {
	var errs []error
	if o.cpus <= 0 || o.memMiB == 0 {
		errs = append(errs, errors.New("-cpus and -mem-mib must be > 0"))
	}
	if o.duration < time.Second || o.warmup < 0 {
		errs = append(errs, errors.New("-d must be >= 1s and -warmup >= 0"))
	}
	if o.loadShare <= 0 || o.loadShare > 1 {
		errs = append(errs, errors.New("-load must be in (0, 1]"))
	}
	if o.lengthFactor < 1 {
		errs = append(errs, errors.New("-length-factor must be >= 1: the bodies' length is at least the budget"))
	}
	if o.inflateRate <= 0 || o.lengthRateMiB <= 0 || o.trickleEvery <= 0 {
		errs = append(errs, errors.New("-inflate-rate, -length-rate and -trickle-every must be > 0"))
	}
	if o.items < 1 || o.maxInflight < 1 || o.capacityC < 1 || o.repeat < 1 {
		errs = append(errs, errors.New("-items, -max-inflight, -capacity-c and -repeat must be >= 1"))
	}
	if o.shrinkCalls < 1 || o.shrinkConns < 1 || o.silentConns < 1 || o.shutdownStreams < 0 || o.liftConns < 1 || o.exemptConns < 1 {
		errs = append(errs, errors.New("-shrink-calls, -shrink-conns, -silent-conns, -lift-conns and -exempt-conns must be >= 1, -shutdown-streams >= 0"))
	}
	if o.silentAddresses < 1 || o.silentAddresses > maxAttackers || o.exemptAddresses < 1 || o.exemptAddresses > maxAttackers {
		errs = append(errs, fmt.Errorf("-silent-addresses and -exempt-addresses must be in [1, %d]", maxAttackers))
	}
	if o.laneHeadMiB < 1 || o.laneMiB <= o.laneHeadMiB || o.laneRate < 1 || o.laneBatchMiB < 1 || o.silentBatchKiB < 1 || o.exemptKiB < 1 {
		errs = append(errs, errors.New("-lane-mib must be more than -lane-head-mib (>= 1); -lane-rate, -lane-batch-mib, -silent-batch-kib and -exempt-kib must be >= 1"))
	}
	if o.shrinkEvery <= 0 || o.shrinkTimeout <= 0 || o.laneBatchEvery < 0 || o.shutdownAfter < time.Second || o.shutdownGrace <= 0 || o.shutdownDeadline <= 0 {
		errs = append(errs, errors.New("-shrink-every, -shrink-timeout, -shutdown-grace and -shutdown-deadline must be > 0, -lane-batch-every >= 0, -shutdown-after >= 1s"))
	}
	return errors.Join(errs...)
}
