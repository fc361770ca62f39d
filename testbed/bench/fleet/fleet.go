// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// member is one collector of the fleet: its process and its metrics.
type member struct {
	name string
	proc *harness.Process
	scr  *harness.Scraper
}

// group is what one scenario started, stopped together in reverse order:
// the fleet's or the tier's processes, relays, scrapers and recorder.
type group struct {
	o        options
	name     string // the scenario's
	cleanups []func()
}

// stop stops everything started, in reverse order, by PID, and removes
// the cgroups.
func (g *group) stop() {
	for i := len(g.cleanups) - 1; i >= 0; i-- {
		g.cleanups[i]()
	}
	g.cleanups = nil
}

// fleet is one scenario's running sink, gateway and agents, and the
// recorder sampling them.
type fleet struct {
	group
	sink    *member
	gateway *member
	cg      *harness.Cgroup
	agents  []*member
	// agentPorts are the agents' OTLP/HTTP ports (the load generator's targets).
	agentPorts []int
	gwPprof    int
	rec        *recorder
}

// fleetSpec is what to start.
type fleetSpec struct {
	name    string
	gateway colconfig.Gateway
	gwBin   string
	gwEnv   []string
	memMiB  uint64
}

// startMember starts one collector with cfg and waits for its metrics.
func (g *group) startMember(ctx context.Context, name, bin string, cfg []byte, metricsPort int, cg *harness.Cgroup, env []string, restart bool) (*member, error) {
	col, err := harness.StartCollector(ctx, harness.CollectorConfig{
		Process: harness.ProcessConfig{
			Bin: bin, Env: env, Cgroup: cg,
			LogPath: filepath.Join(g.o.out, fmt.Sprintf("log-%s-%s.txt", g.name, name)),
			Restart: restart, RestartDelay: g.o.restartDelay, Logf: logf,
		},
		Config: cfg, ConfigPath: filepath.Join(g.o.out, fmt.Sprintf("config-%s-%s.yaml", g.name, name)), MetricsPort: metricsPort,
		// An agent drains its queue on SIGTERM, for as long as its exporter
		// retries: its data is counted by then, so it gets a short grace.
		ReadyTimeout: 30 * time.Second, ScrapeEvery: g.o.interval, StopGrace: 2 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	g.cleanups = append(g.cleanups, col.Stop)
	return &member{name: name, proc: col.Proc, scr: col.Scraper}, nil
}

// startFleet starts the sink, the gateway in its cgroup, the agents, and the
// recorder. On error, what was started is stopped.
func startFleet(ctx context.Context, o options, spec fleetSpec, tw *harness.CSVFile) (_ *fleet, err error) {
	f := &fleet{group: group{o: o, name: spec.name}}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	var sinkHTTPPort int
	if f.sink, sinkHTTPPort, err = f.startSink(ctx); err != nil {
		return nil, err
	}
	if f.cg, err = f.createCgroup(spec.name, o.cpus, spec.memMiB); err != nil {
		return nil, err
	}
	ports, err := harness.FreePorts(4)
	if err != nil {
		return nil, err
	}
	gw := spec.gateway
	gw.HTTPPort, gw.GRPCPort, gw.MetricsPort, gw.PprofPort, gw.SinkHTTPPort = ports[0], ports[1], ports[2], ports[3], sinkHTTPPort
	gw.Bench, gw.MemoryLimiter = "bench/fleet", colconfig.MemoryLimiterYAML
	f.gwPprof = gw.PprofPort
	b, err := gw.Render()
	if err != nil {
		return nil, err
	}
	logf("%s: gateway %s in cgroup v%d (%.2g CPU, %d MiB)%s", spec.name, gw.Kind, f.cg.Version, o.cpus, spec.memMiB, envNote(spec.gwEnv))
	if f.gateway, err = f.startMember(ctx, "gateway", spec.gwBin, b, gw.MetricsPort, f.cg, spec.gwEnv, true); err != nil {
		return nil, err
	}
	if f.agents, f.agentPorts, err = f.startAgents(ctx, gw.HTTPPort, gw.GRPCPort); err != nil {
		return nil, err
	}

	f.rec = newRecorder(spec.name, o, f, tw)
	f.cleanups = append(f.cleanups, harness.Background(func(ctx context.Context) { f.rec.run(ctx, o.interval) }))
	return f, nil
}

// startSink starts the sink and returns it and its OTLP/HTTP port, where
// the gateways export.
func (g *group) startSink(ctx context.Context) (*member, int, error) {
	ports, err := harness.FreePorts(3)
	if err != nil {
		return nil, 0, err
	}
	cfg := sinkConfig{HTTPPort: ports[0], GRPCPort: ports[1], MetricsPort: ports[2]}
	b, err := colconfig.Render(sinkTmpl, cfg)
	if err != nil {
		return nil, 0, err
	}
	m, err := g.startMember(ctx, "sink", g.o.stockBin, b, cfg.MetricsPort, nil, nil, false)
	if err != nil || g.o.backendRate <= 0 {
		return m, cfg.HTTPPort, err
	}
	// A slow backend: a link that carries only so much; the sink itself
	// stays healthy, so that its count (the truth) is read on time.
	r, err := harness.SlowRelay(fmt.Sprintf("127.0.0.1:%d", cfg.HTTPPort), g.o.backendRate)
	if err != nil {
		return m, 0, err
	}
	g.cleanups = append(g.cleanups, r.Close)
	_, port, err := net.SplitHostPort(r.Addr())
	if err != nil {
		return m, 0, err
	}
	p, err := strconv.Atoi(port)
	logf("%s: the backend is slow: the sink behind a relay of %d bytes/s", g.name, g.o.backendRate)
	return m, p, err
}

// createCgroup creates a gateway's cgroup, named after the benchmark, this
// process and name, and removes it with the group (after killing what is
// left in it).
func (g *group) createCgroup(name string, cpus float64, memMiB uint64) (*harness.Cgroup, error) {
	cg, err := harness.CreateCgroup(fmt.Sprintf("throttle-%s-%d-%s", g.o.bench, os.Getpid(), sanitize(name)), cpus, memMiB<<20)
	if err != nil {
		return nil, err
	}
	g.cleanups = append(g.cleanups, func() { cg.Remove(logf) })
	return cg, nil
}

// startAgents starts -agents agents exporting over -protocol to the
// gateway's (or the balancer's) OTLP/HTTP or OTLP/gRPC port, and returns
// them and their OTLP/HTTP ports (the load generators' targets).
func (g *group) startAgents(ctx context.Context, httpPort, grpcPort int) (agents []*member, agentPorts []int, err error) {
	exporter, endpoint := "otlp_http", fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	if g.o.protocol == "grpc" {
		exporter, endpoint = "otlp_grpc", fmt.Sprintf("127.0.0.1:%d", grpcPort)
	}
	ports, err := harness.FreePorts(2 * g.o.agents)
	if err != nil {
		return nil, nil, err
	}
	for i := range g.o.agents {
		ac := colconfig.Agent{Bench: "bench/fleet", HTTPPort: ports[2*i], MetricsPort: ports[2*i+1], Exporter: exporter, Endpoint: endpoint, Compression: g.o.agentCompression}
		if g.o.distinctAddrs {
			if ac.Endpoint, err = g.relayFor(i, endpoint); err != nil {
				return nil, nil, err
			}
		}
		b, err := ac.Render()
		if err != nil {
			return nil, nil, err
		}
		m, err := g.startMember(ctx, fmt.Sprintf("agent%d", i+1), g.o.stockBin, b, ac.MetricsPort, nil, nil, false)
		if err != nil {
			return nil, nil, err
		}
		agents = append(agents, m)
		agentPorts = append(agentPorts, ac.HTTPPort)
	}
	return agents, agentPorts, nil
}

// relayFor starts the relay of agent i (source 127.0.0.11 for the first)
// to the gateway's endpoint and returns the endpoint the agent sends to.
func (g *group) relayFor(i int, endpoint string) (string, error) {
	scheme, hostPort, ok := strings.Cut(endpoint, "://")
	if !ok {
		scheme, hostPort = "", endpoint
	}
	src, err := netip.ParseAddr(fmt.Sprintf("127.0.0.%d", 11+i)) // run bounds -agents
	if err != nil {
		return "", fmt.Errorf("agent%d's relay: %w", i+1, err)
	}
	r, err := harness.StartRelay(src, hostPort)
	if err != nil {
		return "", fmt.Errorf("agent%d's relay: %w", i+1, err)
	}
	g.cleanups = append(g.cleanups, r.Close)
	if scheme == "" {
		return r.Addr(), nil
	}
	return scheme + "://" + r.Addr(), nil
}

func envNote(env []string) string {
	if len(env) == 0 {
		return ""
	}
	return fmt.Sprintf(", env %v", env)
}

// sanitize makes a scenario name usable in a cgroup or file name.
func sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		if !nameByte(c) {
			out[i] = '_'
		}
	}
	return string(out)
}

// nameByte reports whether c may stay in a cgroup or file name: [a-zA-Z0-9_-].
func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// load runs one load generator per agent with the given phases and returns
// their reports. The phases' rates are per agent.
func (f *fleet) load(ctx context.Context, phases []loadgen.Phase, logName string) ([]*loadgen.Report, error) {
	return f.runLoad(ctx, f.agentPorts, &f.rec.loadCounts, phases, logName)
}

// runLoad runs one load generator per agent port with the given phases,
// counted in counts, and returns their reports. The phases' rates are per
// agent.
func (g *group) runLoad(ctx context.Context, agentPorts []int, counts *loadCounts, phases []loadgen.Phase, logName string) ([]*loadgen.Report, error) {
	sigs, _ := loadgen.ParseSignals("traces")
	runners := make([]*loadgen.Runner, len(agentPorts))
	for i, port := range agentPorts {
		r, err := loadgen.New(loadgen.Config{
			Target: fmt.Sprintf("http://127.0.0.1:%d", port), Protocol: loadgen.HTTP, Signals: sigs,
			Timeout: 10 * time.Second, Phases: phases,
		})
		if err != nil {
			return nil, err
		}
		runners[i] = r
	}
	counts.setRunners(runners)
	out, err := os.Create(filepath.Join(g.o.out, fmt.Sprintf("loadgen-%s-%s.txt", g.name, logName)))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	var mu sync.Mutex
	reps := make([]*loadgen.Report, len(runners))
	errs := make([]error, len(runners))
	var wg sync.WaitGroup
	for i, r := range runners {
		wg.Go(func() {
			w := &lockedWriter{mu: &mu, w: out}
			fmt.Fprintf(w, "agent%d:\n", i+1)
			reps[i], errs[i] = r.Run(ctx, w)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return reps, err
		}
	}
	return reps, nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// gomemlimitEnv sets GOMEMLIMIT to -gomemlimit-pct of a gateway's memory
// limit, as the Helm chart does.
func (o options) gomemlimitEnv() []string {
	return []string{"GOMEMLIMIT=" + strconv.FormatUint(uint64(float64(o.memMiB<<20)*o.gomemlimitPct/100), 10)}
}

// unlimitedMiB is the memory limit of a gateway whose memory must not
// matter: the capacity measurement and the reference scenario.
func unlimitedMiB(o options) uint64 { return max(o.memMiB, 1024) }

// measureCapacity finds the rate the stock gateway delivers to the sink at
// most: the agents and the gateway as in the scenarios, but a memory limit
// generous enough that memory plays no part, and an open loop stepped up
// from -capacity-start by -capacity-growth each -capacity-step, until the
// delivered rate stops growing (harness.CapacitySearch). Each step is read over its
// second half: a synchronous measurement (each request waiting for the
// sink) under-reads the rate, since batching and the exporter's queue let
// the gateway overlap receiving and exporting.
//
// The best step is the winner of several noisy readings of the plateau, so
// it reads high: the capacity is the best step's offered rate measured
// again (remeasureCapacity), which is a reading of the same rate with no
// selection in it. capacity.md keeps both.
func measureCapacity(ctx context.Context, o options, tw *harness.CSVFile) (float64, error) {
	// The steps go to stdout and to capacity.md, which the report includes,
	// written whatever happened: a failed measurement is read there.
	var steps bytes.Buffer
	capacity, err := findCapacity(ctx, o, tw, io.MultiWriter(os.Stdout, &steps))
	if werr := os.WriteFile(filepath.Join(o.out, report.FleetCapacityFile), steps.Bytes(), 0o644); err == nil {
		err = werr
	}
	return capacity, err
}

// findCapacity searches the best step, measures it again and writes both
// to out.
func findCapacity(ctx context.Context, o options, tw *harness.CSVFile, out io.Writer) (float64, error) {
	search, err := searchCapacity(ctx, o, tw, out)
	if err != nil {
		return 0, err
	}
	if search.Best <= 0 {
		return 0, fmt.Errorf("nothing delivered (see %s)", o.out)
	}
	again, err := remeasureCapacity(ctx, o, tw, search.BestOffered)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "\nBest step: %.0f spans/s, at %.0f offered. The same rate offered again to a fresh fleet for %s delivered %.0f spans/s over its second half.\n",
		search.Best, search.BestOffered, remeasureLength(o), again)
	if again <= 0 {
		return 0, fmt.Errorf("nothing delivered when the capacity was measured again (see %s)", o.out)
	}
	fmt.Fprintf(out, "\nCapacity: %.0f spans/s.\n", again)
	return again, nil
}

// searchCapacity steps the offered rate up until the search is done,
// writing each step to out.
func searchCapacity(ctx context.Context, o options, tw *harness.CSVFile, out io.Writer) (*harness.CapacitySearch, error) {
	f, err := startCapacityFleet(ctx, o, tw, "capacity")
	if err != nil {
		return nil, err
	}
	defer f.stop()
	fmt.Fprintf(out, "\nCapacity of the gateway (%.2g CPU, stock, memory not limiting; %d agents over %s, %d-span requests):\n\n", o.cpus, o.agents, o.protocol, o.spans)
	return o.capacitySteps().Search(ctx, func(ctx context.Context, rate float64, step int) (float64, error) {
		return capacityStep(ctx, o, f, rate, o.capStep, fmt.Sprintf("capacity-%02d", step))
	}, out)
}

// startCapacityFleet starts the fleet the capacity is measured on: the
// stock gateway with memory enough not to matter.
func startCapacityFleet(ctx context.Context, o options, tw *harness.CSVFile, name string) (*fleet, error) {
	return startFleet(ctx, o, fleetSpec{
		name: name, gateway: colconfig.Gateway{Kind: colconfig.KindStock},
		gwBin: o.stockBin, memMiB: unlimitedMiB(o),
	}, tw)
}

// remeasureLength is how long the capacity is measured again: twice a
// step, for a steadier reading.
func remeasureLength(o options) time.Duration { return 2 * o.capStep }

// remeasureCapacity offers rate to a fresh fleet (no backlog in the agents
// from the steps over the plateau, a gateway that has not been through
// them) and returns what the sink received over the second half.
func remeasureCapacity(ctx context.Context, o options, tw *harness.CSVFile, rate float64) (float64, error) {
	f, err := startCapacityFleet(ctx, o, tw, "capacity-again")
	if err != nil {
		return 0, err
	}
	defer f.stop()
	return capacityStep(ctx, o, f, rate, remeasureLength(o), "capacity-again")
}

// capacityStep offers rate for length and returns what the sink received
// over its second half.
func capacityStep(ctx context.Context, o options, f *fleet, rate float64, length time.Duration, logName string) (float64, error) {
	f.rec.setPhase(fmt.Sprintf("capacity %.0f", rate))
	start := time.Now()
	if _, err := f.load(ctx, []loadgen.Phase{{
		Name: "step", Duration: length, Rate: rate / float64(o.spans) / float64(o.agents),
		MaxInflight: 256, Items: o.spans, AttrSize: o.attrSize,
	}}, logName); err != nil {
		return 0, err
	}
	return f.rec.sinkRate(start.Add(length/2), start.Add(length)), nil
}

// runScenario runs one scenario: warmup, burst, drain.
func runScenario(ctx context.Context, o options, s scenario, tw *harness.CSVFile) (*summary, error) {
	spec := fleetSpec{
		name: s.name, gateway: colconfig.Gateway{Kind: s.kind, ThrottleYAML: o.throttleYAML, Downstream: s.downstream, QueueSize: o.queueSize},
		gwBin: o.binFor(s.kind), memMiB: o.memMiB,
	}
	if s.unlimited {
		spec.memMiB = unlimitedMiB(o)
	}
	if s.gomemlimit {
		spec.gwEnv = o.gomemlimitEnv()
	}
	f, err := startFleet(ctx, o, spec, tw)
	if err != nil {
		return nil, err
	}
	defer f.stop()
	if o.profile > 0 {
		go f.profileGateway(ctx, o.warmup+o.profileAt, o.profile)
	}
	// endHang resumes the backend if it still hangs and says how long it
	// hung; deferred, it resumes it before f.stop.
	endHang := func() time.Duration { return 0 }
	if o.backendHang > 0 {
		hctx, cancel := context.WithCancel(ctx)
		hung := make(chan time.Duration, 1)
		go func() { hung <- f.hangBackend(hctx, o.warmup+o.backendHangAt, o.backendHang) }()
		endHang = sync.OnceValue(func() time.Duration { cancel(); return <-hung })
		defer endHang()
	}
	b, err := f.runBurst(ctx, f.rec, f.agentPorts, o.capacity, o.factor)
	if err != nil {
		return nil, err
	}
	sum := summarize(o, s, f, b)
	sum.BackendHungSeconds = endHang().Seconds()
	logf("%s: delivered %.2f%% (%d of %d), gateway lost %d, burst %.0f spans/s to the sink (%.0f%% of capacity), OOM kills %d, restarts %d, drained %v",
		s.name, sum.DeliveredPct, sum.SinkSpans, sum.AgentAccepted, sum.Lost, sum.BurstSinkRate, sum.BurstPctCapacity,
		sum.OOMKills, sum.Restarts, sum.drainNote())
	return sum, ctx.Err()
}

// burst is what came of a scenario's load, run alike by the fleet and the
// tier: the load generators' reports, when the burst ended, the drain's
// length (< 0: not within -drain-max) and the load averages before and
// after.
type burst struct {
	reps                     []*loadgen.Report
	end                      time.Time
	drained                  time.Duration
	loadAvgStart, loadAvgEnd string
}

// burstRecorder is what runBurst needs of a scenario's recorder.
type burstRecorder interface {
	setPhase(p string)
	counts() *loadCounts
	latestFlow() (flow, bool)
}

// runBurst runs a scenario's load through the agents at agentPorts, open
// loops: a warmup at a fifth of capacity, the burst at factor times it;
// then it waits for the drain.
func (g *group) runBurst(ctx context.Context, rec burstRecorder, agentPorts []int, capacity, factor float64) (*burst, error) {
	o := g.o
	perAgent := func(spansPerSec float64) float64 {
		return spansPerSec / float64(o.spans) / float64(o.agents)
	}
	// The open loop never waits for an agent; the cap only guards against
	// an agent that stops answering.
	const maxInflight = 256
	phases := []loadgen.Phase{
		{Name: "warmup", Duration: o.warmup, Rate: perAgent(capacity / 5), MaxInflight: maxInflight, Items: o.spans, AttrSize: o.attrSize},
		{Name: "burst", Duration: o.burst, Rate: perAgent(factor * capacity), MaxInflight: maxInflight, Items: o.spans, AttrSize: o.attrSize},
	}
	b := &burst{loadAvgStart: harness.LoadAvg()}
	rec.setPhase("load")
	var err error
	if b.reps, err = g.runLoad(ctx, agentPorts, rec.counts(), phases, "load"); err != nil {
		return nil, err
	}
	b.end = time.Now()
	rec.setPhase("drain")
	b.drained = g.waitDrained(ctx, b.end, len(agentPorts), rec.latestFlow)
	b.loadAvgEnd = harness.LoadAvg()
	return b, nil
}

// waitDrained waits until every agent has settled everything it accepted
// (sent, or failed for good) and every agent queue is empty, both for
// settle, and the sink has not moved for settle; it gives up after
// drainMax. It returns the drain time, or a negative duration when the
// fleet did not drain. The agents must have been empty for settle too: the
// last batch an agent hands over is still in the gateway's batch processor
// and exporter when the agents empty, and the sink, idle while that agent
// was in its back-off, would otherwise look settled already. latest is
// the last recorded flow of the group's agents (of which there are agents)
// and sink.
func (g *group) waitDrained(ctx context.Context, from time.Time, agents int, latest func() (flow, bool)) time.Duration {
	deadline := time.NewTimer(g.o.drainMax)
	defer deadline.Stop()
	tick := time.NewTicker(g.o.interval)
	defer tick.Stop()
	lastSink, lastMove := -1.0, time.Now()
	var emptySince time.Time
	for {
		select {
		case <-ctx.Done():
			return -1
		case <-deadline.C:
			return -1
		case <-tick.C:
		}
		p, ok := latest()
		if !ok {
			continue
		}
		if p.sinkSpans != lastSink {
			lastSink, lastMove = p.sinkSpans, time.Now()
		}
		settled := p.agSent+p.agSendFailed+p.agEnqueueFailed >= p.agAccepted
		if !settled || p.agQueue != 0 || p.agentsFresh != agents {
			emptySince = time.Time{}
			continue
		}
		if emptySince.IsZero() {
			emptySince = time.Now()
		}
		if time.Since(emptySince) >= g.o.settle && time.Since(lastMove) >= g.o.settle {
			return lastMove.Sub(from)
		}
	}
}

// profileGateway takes one CPU profile of the gateway through its pprof
// extension and writes it next to the results.
func (f *fleet) profileGateway(ctx context.Context, after, length time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(after):
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", f.gwPprof, int(length.Seconds()))
	cctx, cancel := context.WithTimeout(ctx, length+30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, url, http.NoBody)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		logf("%s: profile: %v", f.name, err)
		return
	}
	defer resp.Body.Close()
	path := filepath.Join(f.o.out, "profile-"+sanitize(f.name)+".pprof")
	out, err := os.Create(path)
	if err != nil {
		return
	}
	defer out.Close()
	if _, err := io.Copy(out, resp.Body); err != nil {
		logf("%s: profile: %v", f.name, err)
		return
	}
	logf("%s: CPU profile of the gateway in %s", f.name, path)
}

// hangBackend stops the sink (SIGSTOP) after, and resumes it (SIGCONT)
// length later or when ctx ends, whichever comes first: the gateway's
// exporter then finds a backend that takes its connections and never
// answers, as a hung one does. It returns how long the sink was stopped.
func (f *fleet) hangBackend(ctx context.Context, after, length time.Duration) time.Duration {
	select {
	case <-ctx.Done():
		return 0
	case <-time.After(after):
	}
	pid, alive, _ := f.sink.proc.State()
	if !alive {
		logf("%s: backend hang: the sink is not running", f.name)
		return 0
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		logf("%s: backend hang: %v", f.name, err)
		return 0
	}
	start := time.Now()
	logf("%s: the backend hangs (sink stopped) for %s", f.name, length)
	select {
	case <-ctx.Done():
	case <-time.After(length):
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		logf("%s: backend resume: %v", f.name, err)
	}
	d := time.Since(start)
	logf("%s: the backend resumes after %s", f.name, d.Round(100*time.Millisecond))
	return d
}
