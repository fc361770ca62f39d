// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// The autoscaling replay (-tier N -autoscale cpu,demand): the tier of N
// equal throttle replicas starts with one replica in the balancer's
// rotation, stock agents send a sustained load of -factor times one
// replica's capacity, and Kubernetes' HPA (hpa.go) is replayed against it,
// once per signal, to see which brings the tier to the replicas it needs
// sooner and whether anything is lost on the way:
//
//   - every hpaSyncPeriod from the load's start, the HPA reads each pod's
//     metric and sets the scale (at most N replicas; never down);
//   - a replica the scale adds is started then (its collector's own start,
//     in its cgroup), and turns ready at the first readiness probe that
//     finds it answering: probes at its start and every -autoscale-probe-period
//     after, as a pod's readinessProbe with Kubernetes' default period; the
//     one at its start finds the collector not yet listening. Ready, it
//     joins the balancer's rotation (HAProxy's runtime API), as a pod joins
//     a Service's endpoints.
//
// The signals (autoscaleSignals) are read at the sync itself, with none of
// a cluster's metrics pipeline delay; a pod's metric is its latest scrape
// of the last sync period, as a metrics adapter serves the latest sample,
// so that an overloaded replica whose endpoint answered late still counts. Rounds run every scenario under every
// signal once, back to back, the signals' order alternating between rounds,
// so that the machine's noise falls on both alike and they are compared
// round by round.

// The signals the replay scales on.
const (
	signalCPU    = "cpu"
	signalDemand = "demand"
)

// autoscaleSignal is a metric the replayed HPA scales on.
type autoscaleSignal struct {
	// target is the target per pod, the example HPA's
	// (examples/kubernetes/hpa-cpu.yaml, hpa-demand.yaml).
	target float64
	// what the HPA reads, for the report.
	what string
}

var autoscaleSignals = map[string]autoscaleSignal{
	signalCPU: {target: 0.7, what: "CPU utilisation, a Resource metric: the replica's cgroup CPU time over the last 15 s (metrics-server's " +
		"resolution) over its quota (requests = limits); a pod not ready, or ready for less than that window, is set aside"},
	signalDemand: {target: 0.8, what: "`" + demandMetric + "`, a Pods metric: the gauge from the replica's own metrics endpoint " +
		"(its last scrape, at most 2 s old); every pod with one counts"},
}

// demandMetric is the throttle's demand gauge as its collector exports it.
const demandMetric = "otelcol_throttle_demand"

// autoscaleOptions are the replay's own flags.
type autoscaleOptions struct {
	// signals to replay the HPA on, in order (none: the tier benchmark).
	signals []string
	// probePeriod is the readiness probe's period.
	probePeriod time.Duration
}

// Defaults of the replay that differ from the tier's.
const (
	// autoscaleFactor: the load is 2.5 replicas' capacity, so that three
	// are needed.
	autoscaleFactor = 2.5
	// autoscaleLoad is how long the load lasts: long enough for the
	// slower signal to take a few steps.
	autoscaleLoad = 2 * time.Minute
	// autoscaleProbePeriod: a readinessProbe's default periodSeconds.
	autoscaleProbePeriod = 10 * time.Second
	// autoscaleConnAge is the max_connection_age of the gRPC scenario that
	// has one.
	autoscaleConnAge = "30s"
)

func autoscaleFlags(a *autoscaleOptions) {
	flag.Func("autoscale", "tier: replay the HPA on these signals (cpu, demand), from one ready replica of -tier, instead of the tier benchmark", func(s string) error {
		for _, n := range strings.Split(s, ",") {
			n = strings.TrimSpace(n)
			if _, ok := autoscaleSignals[n]; !ok || slices.Contains(a.signals, n) {
				return fmt.Errorf("-autoscale: %q: want %s, each once", n, strings.Join(slices.Sorted(mapKeys(autoscaleSignals)), ", "))
			}
			a.signals = append(a.signals, n)
		}
		return nil
	})
	a.probePeriod = autoscaleProbePeriod
	flag.DurationVar(&a.probePeriod, "autoscale-probe-period", a.probePeriod, "autoscale: period of a new replica's readiness probe (the first, at its start, finds it still starting)")
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// setupAutoscale fills in the replay's defaults and checks its flags.
func setupAutoscale(o options) (options, error) {
	t := &o.tier
	if t.cpus == nil {
		for range t.replicas {
			t.cpus = append(t.cpus, tierCPUs)
		}
	}
	if len(o.factors) == 0 {
		o.factors = []float64{autoscaleFactor}
	}
	if !slices.Contains(o.set, "burst") {
		o.burst = autoscaleLoad
	}
	if !slices.Contains(o.set, "scenarios") {
		o.scenarios = colconfig.KindThrottle
		if o.protocol == "grpc" {
			o.scenarios += "," + colconfig.KindThrottle + "+age=" + autoscaleConnAge
		}
	}
	o, err := setupTier(o)
	if err != nil {
		return o, err
	}
	o.bench = "replay"
	if t.replicas < 2 {
		return o, errors.New("-tier: the autoscaling replay needs at least 2 replicas to scale to")
	}
	if len(o.factors) != 1 {
		return o, errors.New("-factor: the autoscaling replay takes one factor: the load in one replica's capacities")
	}
	if o.autoscale.probePeriod <= 0 {
		return o, errors.New("-autoscale-probe-period must be > 0")
	}
	if o.burst < 2*hpaSyncPeriod {
		return o, fmt.Errorf("-burst: the load must last at least two HPA syncs (%s)", 2*hpaSyncPeriod)
	}
	return o, nil
}

// parseAutoscaleScenarios parses -scenarios for the replay: throttle
// gateways only (the demand signal is theirs).
func parseAutoscaleScenarios(s string) ([]tierScenario, error) {
	scens, err := parseTierScenarios(s)
	if err != nil {
		return nil, err
	}
	for _, sc := range scens {
		if sc.kind != colconfig.KindThrottle {
			return nil, fmt.Errorf("-scenarios: %q: the autoscaling replay runs throttle gateways only (the demand signal is theirs)", sc.name)
		}
	}
	return scens, nil
}

// neededReplicas is the fewest replicas whose summed capacity takes
// offered (len(caps) when none does).
func neededReplicas(caps []float64, offered float64) int {
	var c float64
	for i, v := range caps {
		if c += v; c >= offered {
			return i + 1
		}
	}
	return len(caps)
}

// runAutoscale runs the replay (-tier N -autoscale ...).
func runAutoscale(o options) error {
	o, err := setupAutoscale(o)
	if err != nil {
		return err
	}
	scens, err := parseAutoscaleScenarios(o.scenarios)
	if err != nil {
		return err
	}
	if o.tier.haproxy, err = haproxy.Find(o.tier.haproxy); err != nil {
		return err
	}
	for _, b := range []string{o.stockBin, o.throttleBin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("binary %s: %w (make otelcol otelcol-stock)", b, err)
		}
	}
	for _, p := range []*string{&o.stockBin, &o.throttleBin} {
		*p, _ = filepath.Abs(*p)
	}
	if o.out, err = harness.RunDir(".", o.out, cmp.Or(o.name, "autoscale-"+o.protocol), time.Now()); err != nil {
		return err
	}
	budget := time.Minute
	if o.tier.capacities == nil {
		budget += time.Duration(o.capMaxSteps)*(o.capStep+5*time.Second) + remeasureLength(o) + 2*time.Minute
	}
	budget += time.Duration(o.tier.rounds*len(scens)*len(o.autoscale.signals)) * (o.warmup + o.burst + o.drainMax + 2*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf("autoscaling replay: up to %d replicas (%v CPU, %d MiB each), %d agents over %s, HPA on %v; results in %s; whole run bounded to %s",
		o.tier.replicas, o.tier.cpus, o.memMiB, o.agents, o.protocol, o.autoscale.signals, o.out, budget.Round(time.Second))
	machine := harness.MachineInfo(os.Args)
	if err := os.WriteFile(filepath.Join(o.out, "machine.txt"), []byte(machine), 0o644); err != nil {
		return err
	}
	caps := o.tier.capacities
	if caps == nil {
		if caps, err = measureTierCapacities(ctx, o, []float64{slices.Max(o.tier.cpus)}); err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
		logf("capacity of the replicas: %v spans/s (-tier-capacity %s to reuse it)", caps, joinFloats(caps, 0))
	}

	files := map[string]*harness.CSVFile{}
	for name, header := range map[string][]string{
		"timeline.csv": tierTimelineHeader, "timeline-replicas.csv": replicaTimelineHeader, "hpa.csv": hpaHeader(len(caps)),
	} {
		if files[name], err = harness.CreateCSV(filepath.Join(o.out, name), header); err != nil {
			return err
		}
		defer files[name].Close()
	}
	rep := &autoscaleReport{o: o, caps: caps, machine: machine}
	for round := 1; round <= o.tier.rounds; round++ {
		signals := slices.Clone(o.autoscale.signals)
		if round%2 == 0 {
			slices.Reverse(signals)
		}
		for _, sc := range scens {
			for order, sig := range signals {
				run, err := runAutoscaleOnce(ctx, o, caps, sc, sig, round, order+1,
					files["timeline.csv"], files["timeline-replicas.csv"], files["hpa.csv"])
				if run != nil {
					rep.runs = append(rep.runs, run)
					if err := rep.write(); err != nil {
						return err
					}
				}
				if err != nil {
					return fmt.Errorf("round %d, %s, HPA on %s: %w", round, sc.name, sig, err)
				}
			}
		}
	}
	rep.printTable(os.Stdout)
	logf("report: %s", filepath.Join(o.out, "report.md"))
	return nil
}

// runAutoscaleOnce runs one scenario under one signal on a fresh tier: the
// warmup at a fifth of one replica's capacity on the one ready replica,
// the load with the HPA replayed from its start, the drain.
func runAutoscaleOnce(ctx context.Context, o options, caps []float64, sc tierScenario, sig string, round, order int, tw, rw, hw *harness.CSVFile) (*autoscaleRun, error) {
	base := sc.name
	sc.name += "@" + sig
	factor := o.factors[0]
	t, err := startTier(ctx, o, caps, sc, round, factor, 1, tw, rw)
	if err != nil {
		return nil, err
	}
	defer t.stop()
	up := time.Now()
	s := newScaler(t, base, sig, o.autoscale.probePeriod, hw, up)
	one := caps[0]
	perAgent := func(spansPerSec float64) float64 { return spansPerSec / float64(o.spans) / float64(o.agents) }
	const maxInflight = 256
	t.rec.setPhase("warmup")
	warm, err := t.runLoad(ctx, t.agentPorts, &t.rec.loadCounts, []loadgen.Phase{
		{Name: "warmup", Duration: o.warmup, Rate: perAgent(one / 5), MaxInflight: maxInflight, Items: o.spans, AttrSize: o.attrSize},
	}, "warmup")
	if err != nil {
		return nil, err
	}
	la0 := harness.LoadAvg()
	t.rec.setPhase("load")
	s.start(ctx, time.Now())
	t.cleanups = append(t.cleanups, s.stop)
	load, err := t.runLoad(ctx, t.agentPorts, &t.rec.loadCounts, []loadgen.Phase{
		{Name: "load", Duration: o.burst, Rate: perAgent(factor * one), MaxInflight: maxInflight, Items: o.spans, AttrSize: o.attrSize},
	}, "load")
	if err != nil {
		return nil, err
	}
	loadEnd := time.Now()
	t.rec.setPhase("drain")
	drained := t.waitDrained(ctx, loadEnd, len(t.agents), func() (flow, bool) {
		p, ok := t.rec.latest()
		return p.flow, ok
	})
	s.stop()
	sum := summarizeTier(o, t, &burst{reps: append(warm, load...), end: loadEnd, drained: drained, loadAvgStart: la0, loadAvgEnd: harness.LoadAvg()})
	run := s.result(caps, factor*one, round, order, loadEnd, sum)
	logf("%s: HPA on %s: needed %d replicas, ready at %s; delivered %.2f%% (%d of %d), lost %d, OOM kills %d, sink %.0f spans/s over the load",
		t.name, sig, run.needed, secondsNote(run.neededAt()), sum.DeliveredPct, sum.SinkSpans, sum.AgentAccepted, sum.Lost, sum.OOMKills, sum.BurstSinkRate)
	return run, errors.Join(ctx.Err(), s.err())
}

// secondsNote is "12.3 s", or "never" for NaN.
func secondsNote(v float64) string {
	if math.IsNaN(v) {
		return "never"
	}
	return fmt.Sprintf("%.1f s", v)
}

// podLife is when a replica was added to the scale, its collector
// answered and it turned ready (zero: not yet).
type podLife struct {
	added, up, ready time.Time
}

// syncRecord is the HPA's view at one sync.
type syncRecord struct {
	// at is the time from the load's start.
	at          time.Duration
	scaleBefore int
	ready       int
	// Per replica in the scale: each signal's value and how the
	// calculator counted it.
	cpu, demand []podSample
	// metric is the run's signal averaged over the pods counted (what the
	// HPA shows; NaN: none), desired the calculator's count, scale the
	// scale set.
	metric         float64
	desired, scale int
	// sinkRate is the sink's rate since the previous sync, spans/s.
	sinkRate float64
}

// scaler replays the HPA against a tier during one run.
type scaler struct {
	t           *tier
	scenario    string
	signal      string
	target      float64
	probePeriod time.Duration
	hw          *harness.CSVFile
	// groups stop the replicas the scaler starts (nil for the first).
	groups []*group

	hpa       hpaState
	loadStart time.Time
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	stopOnce  sync.Once
	// cpuMarks are the replicas' CPU times at the previous sync, lastSink
	// the sink's count then; the sync goroutine's own.
	cpuMarks []cpuMark
	lastSink struct {
		at    time.Duration
		spans float64
	}

	mu    sync.Mutex
	pods  []podLife
	syncs []syncRecord
	errs  []error
}

// newScaler makes the replayed HPA of t, whose first replica has been
// ready since up.
func newScaler(t *tier, scenario, sig string, probePeriod time.Duration, hw *harness.CSVFile, up time.Time) *scaler {
	n := len(t.replicas)
	s := &scaler{
		t: t, scenario: scenario, signal: sig, target: autoscaleSignals[sig].target, probePeriod: probePeriod, hw: hw,
		groups: make([]*group, n), hpa: hpaState{behavior: defaultScaleUp(1, n)},
		cpuMarks: make([]cpuMark, n), pods: make([]podLife, n),
	}
	s.pods[0] = podLife{added: up, up: up, ready: up}
	for i := 1; i < n; i++ {
		s.groups[i] = &group{o: t.o, name: t.name}
		t.cleanups = append(t.cleanups, s.groups[i].stop)
	}
	return s
}

// start starts the syncs, the first one a sync period after loadStart.
func (s *scaler) start(ctx context.Context, loadStart time.Time) {
	s.loadStart = loadStart
	if st, err := s.t.replicas[0].cg.Stats(); err == nil {
		s.cpuMarks[0] = cpuMark{used: st.CPUUsage, at: loadStart}
	}
	if p, ok := s.t.rec.latest(); ok {
		s.lastSink.at, s.lastSink.spans = s.t.rec.start.Add(p.t).Sub(loadStart), p.sinkSpans
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.wg.Go(func() {
		for k := 1; ; k++ {
			at := loadStart.Add(time.Duration(k) * hpaSyncPeriod)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(at)):
			}
			s.sync(ctx, at)
		}
	})
}

// stop ends the syncs and waits for the replicas being started.
func (s *scaler) stop() {
	s.stopOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
		}
		s.wg.Wait()
	})
}

func (s *scaler) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

// sync is one HPA sync at now: read every pod's metrics, compute the
// scale, and add the replicas it asks for.
func (s *scaler) sync(ctx context.Context, now time.Time) {
	s.mu.Lock()
	pods := slices.Clone(s.pods)
	s.mu.Unlock()
	rec := syncRecord{at: now.Sub(s.loadStart), metric: math.NaN(), sinkRate: math.NaN()}
	for i, p := range pods {
		if p.added.IsZero() {
			break
		}
		rec.scaleBefore++
		if !p.ready.IsZero() {
			rec.ready++
		}
		r := s.t.replicas[i]
		cpu := podSample{value: math.NaN(), state: podMissing}
		if st, err := r.cg.Stats(); err == nil {
			if mk := s.cpuMarks[i]; !mk.at.IsZero() && now.After(mk.at) {
				cpu.value = (st.CPUUsage - mk.used).Seconds() / now.Sub(mk.at).Seconds() / r.cpus
				cpu.state = podCounted
				if p.ready.IsZero() || now.Before(p.ready.Add(hpaCPUWindow)) {
					cpu.state = podSetAside
				}
			}
			s.cpuMarks[i] = cpuMark{used: st.CPUUsage, at: now}
		}
		demand := podSample{value: math.NaN(), state: podMissing}
		if m := r.m.Load(); m != nil {
			if samples, at := m.scr.Get(); !at.IsZero() && now.Sub(at) < hpaSyncPeriod {
				if v := harness.Value(samples, demandMetric, nil); !math.IsNaN(v) {
					demand = podSample{value: v, state: podCounted}
				}
			}
		}
		rec.cpu, rec.demand = append(rec.cpu, cpu), append(rec.demand, demand)
	}
	pods4hpa := rec.cpu
	if s.signal == signalDemand {
		pods4hpa = rec.demand
	}
	var sum float64
	n := 0
	for _, p := range pods4hpa {
		if p.state == podCounted {
			sum += p.value
			n++
		}
	}
	if n > 0 {
		rec.metric = sum / float64(n)
	}
	rec.desired = desiredReplicas(pods4hpa, rec.scaleBefore, s.target, hpaTolerance)
	rec.scale = s.hpa.normalize(now, rec.scaleBefore, rec.desired)
	if p, ok := s.t.rec.latest(); ok {
		at := s.t.rec.start.Add(p.t).Sub(s.loadStart)
		if at > s.lastSink.at {
			rec.sinkRate = (p.sinkSpans - s.lastSink.spans) / (at - s.lastSink.at).Seconds()
		}
		s.lastSink.at, s.lastSink.spans = at, p.sinkSpans
	}
	s.mu.Lock()
	s.syncs = append(s.syncs, rec)
	s.mu.Unlock()
	s.hw.Write(s.hpaRow(rec))
	_ = s.hw.Flush()
	logf("%s: HPA on %s at %.0f s: %d ready of %d, %s %.2f (target %.2f) → %d replicas", s.t.name, s.signal, rec.at.Seconds(),
		rec.ready, rec.scaleBefore, s.signal, rec.metric, s.target, rec.scale)
	for i := rec.scaleBefore; i < rec.scale; i++ {
		s.add(ctx, i, now)
	}
}

// add adds replica i to the scale at now: it is started, probed, and put
// into rotation once ready, in the background.
func (s *scaler) add(ctx context.Context, i int, now time.Time) {
	r := s.t.replicas[i]
	if st, err := r.cg.Stats(); err == nil {
		s.cpuMarks[i] = cpuMark{used: st.CPUUsage, at: now}
	}
	s.mu.Lock()
	s.pods[i].added = now
	s.mu.Unlock()
	s.wg.Go(func() {
		if err := s.bringUp(ctx, i); err != nil && ctx.Err() == nil {
			s.mu.Lock()
			s.errs = append(s.errs, fmt.Errorf("%s: %w", r.name, err))
			s.mu.Unlock()
		}
	})
}

// bringUp starts replica i and sets it ready at the first readiness probe
// that finds it answering (probes at its start and every probePeriod).
func (s *scaler) bringUp(ctx context.Context, i int) error {
	r := s.t.replicas[i]
	started := time.Now()
	if err := r.start(ctx, s.groups[i]); err != nil {
		return err
	}
	up := time.Now()
	s.mu.Lock()
	s.pods[i].up = up
	s.mu.Unlock()
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metricsPort)
	for k := 1; ; k++ {
		at := started.Add(time.Duration(k) * s.probePeriod)
		if at.Before(up) {
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(at)):
		}
		if probe(ctx, url) {
			break
		}
	}
	if err := s.t.lb.setReady(r.name); err != nil {
		return err
	}
	// In rotation once the balancer counts it up (its next health check).
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := s.t.lb.stats()
		if err == nil && strings.HasPrefix(st[r.name].Status, "UP") {
			break
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("the balancer did not count it up within 5 s"), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	ready := time.Now()
	s.mu.Lock()
	s.pods[i].ready = ready
	s.mu.Unlock()
	logf("%s: %s ready at %.1f s (added at %.1f s, its collector answered at %.1f s)", s.t.name, r.name,
		ready.Sub(s.loadStart).Seconds(), s.pods[i].added.Sub(s.loadStart).Seconds(), up.Sub(s.loadStart).Seconds())
	return nil
}

// probe is one readiness probe: a GET answered 200 within a second.
func probe(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// hpaHeader is the header of hpa.csv: one row per sync of every run, the
// HPA's view (see syncRecord) and each of the n replicas' values of both
// signals and how the calculator counted them (counted, missing, aside;
// empty: not in the scale).
func hpaHeader(n int) []string {
	h := []string{"scenario", "signal", "round", "t_s", "scale_before", "ready", "metric", "target", "desired", "scale", "sink_spans_s"}
	for i := range n {
		r := fmt.Sprintf("r%d_", i+1)
		h = append(h, r+"cpu", r+"cpu_pod", r+"demand", r+"demand_pod")
	}
	return h
}

var podStateNames = map[podState]string{podCounted: "counted", podMissing: "missing", podSetAside: "aside"}

func (s *scaler) hpaRow(rec syncRecord) []string {
	row := []string{
		s.scenario, s.signal, strconv.Itoa(s.t.round), f64(rec.at.Seconds(), 1), strconv.Itoa(rec.scaleBefore), strconv.Itoa(rec.ready),
		opt(rec.metric, 3), f64(s.target, 2), strconv.Itoa(rec.desired), strconv.Itoa(rec.scale), opt(rec.sinkRate, 0),
	}
	for i := range s.t.replicas {
		if i >= len(rec.cpu) {
			row = append(row, "", "", "", "")
			continue
		}
		row = append(row, opt(rec.cpu[i].value, 3), podStateNames[rec.cpu[i].state], opt(rec.demand[i].value, 3), podStateNames[rec.demand[i].state])
	}
	return row
}
