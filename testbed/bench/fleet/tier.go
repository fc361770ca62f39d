// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// The tier mode (-tier N): a replica set of N gateways behind a
// connection-level balancer, as users run gateways behind a Kubernetes
// Service, one of them (by default) with half the CPU of the others.
//
//	loadgen ──► agent 1..M ──otlp_http / otlp_grpc──► HAProxy ──────────► replica 1..N ──otlp_http──► sink
//	            (stock, as in the fleet)              (TCP, round-robin,    (each in its own
//	                                                   one frontend per      cgroup, -tier-cpus,
//	                                                   protocol)             -mem-mib)
//
// First the capacity of the largest replica size, measured as the fleet
// measures one gateway's (measureCapacity, on a fleet of its own in a
// subfolder capacity-<cpus>cpu), the smaller sizes' scaled by their CPU
// (or each measured, -tier-capacity-each); the tier's summed capacity is
// the sum over its replicas. Then -rounds rounds; in each, for
// every -factor, every scenario on a fresh tier: a warmup at a fifth of
// the summed capacity, a burst at the factor times it for -burst, and the
// drain. A round runs every scenario once, so the machine's noise falls on
// all of them alike and they are compared round by round.

// tierOptions are the tier mode's own flags; the others are the fleet's.
type tierOptions struct {
	// replicas is the number of gateways (0: the fleet, not the tier).
	replicas int
	// cpus is each replica's CPU quota; capacities each replica's capacity
	// in spans/s (nil: measured).
	cpus, capacities []float64
	// capacityEach measures every replica size's capacity, not only the
	// largest's.
	capacityEach bool
	rounds       int
	haproxy      string
	// connAgeGrace is max_connection_age_grace of the +age= scenarios.
	connAgeGrace time.Duration
}

// Defaults of the tier mode that differ from the fleet's.
const (
	// tierAgents: six agents spread evenly over three replicas by
	// round-robin when each opens one connection (gRPC).
	tierAgents = 6
	// tierInterval: the timeline records every replica once a second.
	tierInterval = time.Second
	// tierCPUs is a replica's default CPU quota; the last has half.
	tierCPUs = 0.2
	// tierAgentCompression: the agents send uncompressed. Compressing
	// costs an agent about what it costs the gateway (gzip is about three
	// quarters of a gateway's CPU, docs/results.md), and the agents take
	// in 1.5 times what the tier can take: with gzip, the agents, the
	// sink and the load generator would need the rest of this 2-core
	// machine at the tier's summed capacity; uncompressed, about as much
	// again as the replicas' quotas.
	tierAgentCompression = "none"
)

// tierFactors are the default burst factors of the tier: about the summed
// capacity, and 1.5 times it.
var tierFactors = []float64{1, 1.5}

func defaultTierOptions() tierOptions {
	return tierOptions{rounds: 3, haproxy: "haproxy"}
}

// tierFlags registers the tier's flags.
func tierFlags(t *tierOptions) {
	flag.IntVar(&t.replicas, "tier", 0, "run the tier: this many gateways per scenario behind HAProxy (TCP, round-robin); 0: the fleet")
	flag.Func("tier-cpus", "tier: CPU quota of each replica, cores, comma-separated (default 0.2 each, the last 0.1)", func(s string) (err error) {
		t.cpus, err = parseList(s, "-tier-cpus", strconv.ParseFloat)
		return err
	})
	flag.Func("tier-capacity", "tier: capacity of each replica in spans/s, comma-separated (default: measured)", func(s string) (err error) {
		t.capacities, err = parseList(s, "-tier-capacity", strconv.ParseFloat)
		return err
	})
	flag.BoolVar(&t.capacityEach, "tier-capacity-each", false, "tier: measure the capacity of every replica size (default: the largest's, the others' scaled by their CPU)")
	flag.IntVar(&t.rounds, "rounds", t.rounds, "tier: rounds; each runs every scenario at every -factor once")
	flag.StringVar(&t.haproxy, "haproxy", t.haproxy, "tier: the HAProxy binary (Debian: apt-get install haproxy)")
	flag.DurationVar(&t.connAgeGrace, "max-connection-age-grace", 0, "tier: max_connection_age_grace of the gRPC servers of the +age= scenarios (0: gRPC's default, unbounded)")
}

// tierScenario is one kind of replica set: the gateway kind of every
// replica and its settings.
type tierScenario struct {
	name       string
	kind       string
	gomemlimit bool
	// connAge is the gRPC server's max_connection_age (0: none).
	connAge time.Duration
}

// tierKinds are the kinds of -scenarios all in the tier.
var tierKinds = []string{colconfig.KindStock, colconfig.KindMemoryLimiter, colconfig.KindThrottle}

// parseTierScenarios parses -scenarios for the tier: kinds, each optionally
// with +gomemlimit and +age=<duration> (the gRPC server's
// max_connection_age); all = stock, memory_limiter, throttle.
func parseTierScenarios(s string) ([]tierScenario, error) {
	if strings.TrimSpace(s) == "all" {
		s = strings.Join(tierKinds, ",")
	}
	var out []tierScenario
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		parts := strings.Split(n, "+")
		sc := tierScenario{name: n, kind: parts[0]}
		if !slices.Contains(kinds, sc.kind) {
			return nil, fmt.Errorf("-scenarios: unknown gateway %q in %q (want %s, each optionally with +gomemlimit and +age=<duration>, or all)", sc.kind, n, strings.Join(kinds, ", "))
		}
		for _, p := range parts[1:] {
			switch v, isAge := strings.CutPrefix(p, "age="); {
			case p == "gomemlimit":
				sc.gomemlimit = true
			case isAge:
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return nil, fmt.Errorf("-scenarios: %q: max_connection_age %q: want a positive duration", n, v)
				}
				sc.connAge = d
			default:
				return nil, fmt.Errorf("-scenarios: %q: unknown suffix %q (want +gomemlimit or +age=<duration>)", n, p)
			}
		}
		out = append(out, sc)
	}
	return out, nil
}

// setupTier fills in the tier's defaults and checks its flags.
func setupTier(o options) (options, error) {
	t := &o.tier
	o.bench = "tier"
	if !slices.Contains(o.set, "agents") {
		o.agents = tierAgents
	}
	if !slices.Contains(o.set, "interval") {
		o.interval = tierInterval
	}
	if !slices.Contains(o.set, "agent-compression") {
		o.agentCompression = tierAgentCompression
	}
	if err := checkCommon(o); err != nil {
		return o, err
	}
	if o.backendHang > 0 || o.queueSize > 0 || o.backendRate > 0 {
		return o, errors.New("-backend-hang, -backend-rate and -queue-size are the fleet's (without -tier)")
	}
	if o.factors = cmpList(o.factors, tierFactors); slices.ContainsFunc(o.factors, func(f float64) bool { return f <= 0 }) {
		return o, errors.New("-factor: every factor must be > 0")
	}
	if t.cpus == nil {
		for i := range t.replicas {
			t.cpus = append(t.cpus, tierCPUs)
			if i == t.replicas-1 && t.replicas > 1 {
				t.cpus[i] = tierCPUs / 2
			}
		}
	}
	if len(t.cpus) != t.replicas || slices.ContainsFunc(t.cpus, func(c float64) bool { return c <= 0 }) {
		return o, fmt.Errorf("-tier-cpus: want %d positive quotas, one per replica", t.replicas)
	}
	if t.capacities != nil && (len(t.capacities) != t.replicas || slices.ContainsFunc(t.capacities, func(c float64) bool { return c <= 0 })) {
		return o, fmt.Errorf("-tier-capacity: want %d positive capacities, one per replica", t.replicas)
	}
	if t.capacities == nil {
		if err := checkCapacitySearch(o); err != nil {
			return o, err
		}
	}
	if t.rounds < 1 {
		return o, errors.New("-rounds must be >= 1")
	}
	if t.connAgeGrace < 0 {
		return o, errors.New("-max-connection-age-grace must be >= 0")
	}
	return o, nil
}

// cmpList is l, or def when l is empty.
func cmpList[T any](l, def []T) []T {
	if len(l) == 0 {
		return def
	}
	return l
}

// runTier runs the tier benchmark (-tier N).
func runTier(o options) error {
	o, err := setupTier(o)
	if err != nil {
		return err
	}
	scens, err := parseTierScenarios(o.scenarios)
	if err != nil {
		return err
	}
	if o.tier.haproxy, err = haproxy.Find(o.tier.haproxy); err != nil {
		return err
	}
	kinds := make([]string, len(scens))
	for i, s := range scens {
		kinds[i] = s.kind
	}
	if err := o.prepareRun(kinds, "tier-"+o.protocol); err != nil {
		return err
	}
	sizes := []float64{slices.Max(o.tier.cpus)}
	if o.tier.capacityEach {
		sizes = distinct(o.tier.cpus)
	}
	budget := time.Minute
	if o.tier.capacities == nil {
		budget += time.Duration(len(sizes)) * (time.Duration(o.capMaxSteps)*(o.capStep+5*time.Second) + remeasureLength(o) + 2*time.Minute)
	}
	budget += time.Duration(o.tier.rounds*len(o.factors)*len(scens)) * (o.warmup + o.burst + o.drainMax + 2*time.Minute)
	ctx, cancel := harness.RunContext(budget)
	defer cancel()
	logf("tier of %d (%v CPU, %d MiB each), %d agents over %s; results in %s; whole run bounded to %s",
		o.tier.replicas, o.tier.cpus, o.memMiB, o.agents, o.protocol, o.out, budget.Round(time.Second))
	caps := o.tier.capacities
	if caps == nil {
		if caps, err = measureTierCapacities(ctx, o, sizes); err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
		logf("capacity of the replicas: %v spans/s (-tier-capacity %s to reuse it)", caps, joinFloats(caps, 0))
	}

	tl, err := harness.CreateCSV(filepath.Join(o.out, "timeline.csv"), tierTimelineHeader)
	if err != nil {
		return err
	}
	defer tl.Close()
	rl, err := harness.CreateCSV(filepath.Join(o.out, "timeline-replicas.csv"), replicaTimelineHeader)
	if err != nil {
		return err
	}
	defer rl.Close()
	var sums []*tierSummary
	for round := 1; round <= o.tier.rounds; round++ {
		for _, factor := range o.factors {
			for _, s := range scens {
				sum, err := runTierScenario(ctx, o, caps, s, round, factor, tl, rl)
				if sum != nil {
					sums = append(sums, sum)
					if err := writeTierSummaries(o, caps, sums); err != nil {
						return err
					}
				}
				if err != nil {
					return fmt.Errorf("round %d, x%g, %s: %w", round, factor, s.name, err)
				}
			}
		}
	}
	printTierSummaries(os.Stdout, o, caps, sums)
	if err := writeTierReport(o.out, o.protocol); err != nil {
		return err
	}
	logf("report: %s", filepath.Join(o.out, "report.md"))
	return nil
}

// writeTierReport writes the run's report.md: the machine, commit and
// command of the run (machine.txt) above its tables (summary.md), what
// make promote needs of a baseline.
func writeTierReport(dir, protocol string) error {
	machine, err := os.ReadFile(filepath.Join(dir, "machine.txt"))
	if err != nil {
		return err
	}
	summary, err := os.ReadFile(filepath.Join(dir, "summary.md"))
	if err != nil {
		return err
	}
	md := fmt.Sprintf("# Gateway tier, OTLP/%s agents\n\n```\n%s```\n\n%s", strings.ToUpper(protocol), machine, summary)
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(md), 0o644)
}

// distinct is the distinct values of l, in their first order.
func distinct(l []float64) []float64 {
	var out []float64
	for _, v := range l {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

func joinFloats(l []float64, prec int) string {
	s := make([]string, len(l))
	for i, v := range l {
		s[i] = f64(v, prec)
	}
	return strings.Join(s, ",")
}

// measureTierCapacities measures the capacity of each replica size in
// sizes as the fleet measures its gateway's (a fleet of the stock gateway
// of that size, in a subfolder), writes capacity.md, and returns each
// replica's: its size's, or, for a size not measured, the largest size's
// scaled by its CPU. Why scaled by default: a replica's work is CPU-bound,
// and on a busy 2-core machine the smaller size's measurement is the
// noisier one: the same noise is a larger share of its rate.
func measureTierCapacities(ctx context.Context, o options, sizes []float64) ([]float64, error) {
	bySize := map[float64]float64{}
	var b strings.Builder
	fmt.Fprintf(&b, "Capacity of a replica: the stock gateway of its size alone with memory enough not to matter, %d agents over %s (compression: %s) sending to it directly, measured as the fleet measures its gateway (steps in capacity-<cpus>cpu/capacity.md); a size not measured has the largest size's capacity scaled by its CPU.\n\n",
		o.agents, o.protocol, compressionName(o.agentCompression))
	fmt.Fprintf(&b, "| replica | CPU | capacity, spans/s |\n|---|---|---|\n")
	for _, c := range sizes {
		oc := o
		oc.cpus = c
		oc.out = filepath.Join(o.out, fmt.Sprintf("capacity-%gcpu", c))
		if err := os.MkdirAll(oc.out, 0o755); err != nil {
			return nil, err
		}
		tl, err := harness.CreateCSV(filepath.Join(oc.out, "timeline.csv"), timelineHeader)
		if err != nil {
			return nil, err
		}
		capacity, err := measureCapacity(ctx, oc, tl)
		_ = tl.Close()
		if err != nil {
			return nil, fmt.Errorf("%g CPU: %w", c, err)
		}
		bySize[c] = capacity
	}
	caps, hows := replicaCapacities(o.tier.cpus, bySize)
	for i, c := range o.tier.cpus {
		fmt.Fprintf(&b, "| r%d | %g | %.0f (%s) |\n", i+1, c, caps[i], hows[i])
	}
	fmt.Fprintf(&b, "\nSummed capacity of the tier: %.0f spans/s.\n", sum(caps))
	return caps, os.WriteFile(filepath.Join(o.out, "capacity.md"), []byte(b.String()), 0o644)
}

// replicaCapacities returns the capacity of each replica of cpus from the
// capacities measured by size, and how each was had: a size not measured
// has the largest measured size's scaled by its CPU.
func replicaCapacities(cpus []float64, bySize map[float64]float64) (caps []float64, hows []string) {
	largest := 0.0
	for c := range bySize {
		largest = max(largest, c)
	}
	for _, c := range cpus {
		if v, ok := bySize[c]; ok {
			caps, hows = append(caps, v), append(hows, "measured")
			continue
		}
		caps = append(caps, bySize[largest]*c/largest)
		hows = append(hows, fmt.Sprintf("the %g CPU's × %g / %g", largest, c, largest))
	}
	return caps, hows
}

func sum(l []float64) float64 {
	var s float64
	for _, v := range l {
		s += v
	}
	return s
}

// tier is one scenario's running sink, replicas, balancer and agents, and
// the recorder sampling them.
type tier struct {
	group
	scenario   tierScenario
	round      int
	factor     float64
	sink       *member
	replicas   []*replica
	lb         *balancer
	agents     []*member
	agentPorts []int
	rec        *tierRecorder
}

// replica is one gateway of the tier.
type replica struct {
	name           string
	cpus, capacity float64
	cg             *harness.Cgroup
	// bin, cfg and env are its collector, configuration and environment,
	// metricsPort the port of its own metrics.
	bin         string
	cfg         []byte
	env         []string
	metricsPort int
	// m is its collector once started: the autoscaling replay starts
	// replicas while the recorder samples them.
	m atomic.Pointer[member]
}

// start starts the replica's collector in g, which stops it, and waits
// until its metrics answer.
func (r *replica) start(ctx context.Context, g *group) error {
	m, err := g.startMember(ctx, "gateway-"+r.name, r.bin, r.cfg, r.metricsPort, r.cg, r.env, true)
	if err != nil {
		return err
	}
	r.m.Store(m)
	return nil
}

// startTier starts the sink, the replicas in their cgroups, the balancer,
// the agents and the recorder. On error, what was started is stopped.
// Only the first initial replicas are started and in the balancer's
// rotation (0: all); the others have their cgroups and ports, and are out
// of rotation (maintenance) until started (the autoscaling replay).
func startTier(ctx context.Context, o options, caps []float64, sc tierScenario, round int, factor float64, initial int, tw, rw *harness.CSVFile) (_ *tier, err error) {
	name := fmt.Sprintf("r%d-x%g-%s", round, factor, sc.name)
	if initial <= 0 || initial > len(o.tier.cpus) {
		initial = len(o.tier.cpus)
	}
	t := &tier{group: group{o: o, name: name}, scenario: sc, round: round, factor: factor}
	defer func() {
		if err != nil {
			t.stop()
		}
	}()
	var sinkHTTPPort int
	if t.sink, sinkHTTPPort, err = t.startSink(ctx); err != nil {
		return nil, err
	}
	var env []string
	if sc.gomemlimit {
		env = o.gomemlimitEnv()
	}
	servers := make([]balancerServer, len(o.tier.cpus))
	for i, cpus := range o.tier.cpus {
		r := &replica{name: fmt.Sprintf("r%d", i+1), cpus: cpus, capacity: caps[i]}
		if r.cg, err = t.createCgroup(name+"-"+r.name, cpus, o.memMiB); err != nil {
			return nil, err
		}
		ports, err := harness.FreePorts(4)
		if err != nil {
			return nil, err
		}
		gw := colconfig.Gateway{
			Bench: "bench/fleet (tier)", Kind: sc.kind, ThrottleYAML: o.throttleYAML, MemoryLimiter: colconfig.MemoryLimiterYAML,
			HTTPPort: ports[0], GRPCPort: ports[1], MetricsPort: ports[2], PprofPort: ports[3], SinkHTTPPort: sinkHTTPPort,
			MaxConnectionAge: sc.connAge,
		}
		if sc.connAge > 0 {
			gw.MaxConnectionAgeGrace = o.tier.connAgeGrace
		}
		if r.cfg, err = gw.Render(); err != nil {
			return nil, err
		}
		r.bin, r.env, r.metricsPort = o.binFor(sc.kind), env, gw.MetricsPort
		if i < initial {
			if err := r.start(ctx, &t.group); err != nil {
				return nil, err
			}
		}
		t.replicas = append(t.replicas, r)
		servers[i] = balancerServer{Name: r.name, HTTPPort: gw.HTTPPort, GRPCPort: gw.GRPCPort, Disabled: i >= initial}
	}
	logf("%s: %d replicas of %s in cgroups v%d (%v CPU, %d MiB each)%s behind HAProxy, %d started", name, len(t.replicas), sc.kind,
		t.replicas[0].cg.Version, o.tier.cpus, o.memMiB, envNote(env), initial)
	if t.lb, err = t.startBalancer(ctx, o.tier.haproxy, servers); err != nil {
		return nil, err
	}
	if t.agents, t.agentPorts, err = t.startAgents(ctx, t.lb.HTTPPort, t.lb.GRPCPort); err != nil {
		return nil, err
	}
	t.rec = newTierRecorder(t, tw, rw)
	t.cleanups = append(t.cleanups, harness.Background(func(ctx context.Context) { t.rec.run(ctx, o.interval) }))
	return t, nil
}

// runTierScenario runs one scenario on a fresh tier: warmup, burst at
// factor times the summed capacity, drain.
func runTierScenario(ctx context.Context, o options, caps []float64, sc tierScenario, round int, factor float64, tw, rw *harness.CSVFile) (*tierSummary, error) {
	t, err := startTier(ctx, o, caps, sc, round, factor, 0, tw, rw)
	if err != nil {
		return nil, err
	}
	defer t.stop()
	b, err := t.runBurst(ctx, t.rec, t.agentPorts, sum(caps), factor)
	if err != nil {
		return nil, err
	}
	s := summarizeTier(o, t, b)
	logf("%s: delivered %.2f%% (%d of %d), lost %d, burst %.0f spans/s to the sink (%.0f%% of the summed capacity), OOM kills %d, weakest replica took %.0f%% (capacity share %.0f%%), drained %s",
		t.name, s.DeliveredPct, s.SinkSpans, s.AgentAccepted, s.Lost, s.BurstSinkRate, s.BurstPctCapacity, s.OOMKills,
		s.WeakShare, s.WeakCapShare, drainNote(s.DrainSeconds))
	return s, ctx.Err()
}
