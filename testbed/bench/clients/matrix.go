// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// matrix is one scenario's running sink, gateway, agents and clients.
type matrix struct {
	o   options
	s   *scenario
	dir string

	sink    *sink
	cg      *harness.Cgroup
	gw      *harness.Collector
	gwCfg   gatewayConfig
	gwYAML  string
	renamed bool // the gateway took the new configuration names
	agents  map[uint32]*agent
	clients []*clientProc
	rec     *recorder

	cleanups []func()
}

// agent is a stock collector between a feeder and the gateway.
type agent struct {
	col      *harness.Collector
	httpPort int
	logPath  string
}

// clientProc is one client process (the Go SDK or node client, or an
// agent's feeder).
type clientProc struct {
	spec                clientSpec
	proc                *harness.Process
	resultPath, logPath string
	// killed: the process did not end by itself in time.
	killed bool
}

// stop stops everything started, in reverse order, by PID, and removes the
// cgroup.
func (m *matrix) stop() {
	for i := len(m.cleanups) - 1; i >= 0; i-- {
		m.cleanups[i]()
	}
	m.cleanups = nil
}

func (m *matrix) path(name string) string { return filepath.Join(m.dir, name) }

// start starts the sink, the gateway in its cgroup, the agents and the
// recorder. On error the caller stops what was started.
func (m *matrix) start(ctx context.Context) error {
	var err error
	if m.sink, err = startSink(); err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	m.cleanups = append(m.cleanups, m.sink.stop)
	if err := m.startGateway(ctx); err != nil {
		return err
	}
	m.agents = map[uint32]*agent{}
	for _, c := range m.s.clients {
		if c.isAgent() {
			a, err := m.startAgent(ctx, c)
			if err != nil {
				return fmt.Errorf("agent of %s: %w", c.name(), err)
			}
			m.agents[c.id] = a
		}
	}
	m.rec = newRecorder(m)
	m.cleanups = append(m.cleanups, harness.Background(m.rec.run))
	return nil
}

// startGateway writes the gateway's configuration, checks it with the
// distribution's validate command and starts the gateway in its cgroup.
func (m *matrix) startGateway(ctx context.Context) error {
	ports, err := harness.FreePorts(3)
	if err != nil {
		return err
	}
	m.gwCfg = gatewayConfig{
		GRPCPort: ports[0], HTTPPort: ports[1], MetricsPort: ports[2], Sink: m.sink.addr(),
		Stock: m.s.stock, Downstream: m.s.downstream, QueueSize: m.s.queueSize, BlockOnOverflow: m.s.blockOnOverflow,
	}
	bin := m.gatewayBin()
	cfgPath := m.path("config-gateway.yaml")
	// The scenario's settings under today's names; a distribution built
	// before the rename knows only the old ones.
	for _, renamed := range []bool{true, false} {
		m.gwCfg.Throttle = m.s.throttle(renamed)
		b, err := colconfig.Render(gatewayTmpl, m.gwCfg)
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
			return err
		}
		out, verr := exec.CommandContext(ctx, bin, "validate", "--config", cfgPath).CombinedOutput()
		if verr == nil {
			m.gwYAML, m.renamed = string(b), renamed
			break
		}
		if !renamed || m.s.throttle(false) == m.gwCfg.Throttle {
			return fmt.Errorf("%s validate --config %s: %w\n%s", bin, cfgPath, verr, out)
		}
		logf("%s: the distribution does not take the renamed settings (%s); using the old names",
			m.s.name, strings.TrimSpace(lastLine(string(out))))
	}
	cg, err := harness.CreateCgroup(fmt.Sprintf("throttle-clients-%d-%s", os.Getpid(), m.s.name), m.o.cpus, m.o.memMiB<<20)
	if err != nil {
		return err
	}
	m.cg = cg
	m.cleanups = append(m.cleanups, func() { cg.Remove(logf) })
	logf("%s: gateway in cgroup v%d (%.2g CPU, %d MiB), OTLP gRPC :%d HTTP :%d", m.s.name, cg.Version, m.o.cpus, m.o.memMiB, m.gwCfg.GRPCPort, m.gwCfg.HTTPPort)
	m.gw, err = harness.StartCollector(ctx, harness.CollectorConfig{
		Process: harness.ProcessConfig{
			Bin: bin, Cgroup: cg,
			LogPath: m.path("log-gateway.txt"), Restart: true, RestartDelay: time.Second, Logf: logf,
		},
		Config: []byte(m.gwYAML), ConfigPath: cfgPath, MetricsPort: m.gwCfg.MetricsPort,
		ReadyTimeout: 30 * time.Second, ScrapeEvery: m.o.interval, StopGrace: 10 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	m.cleanups = append(m.cleanups, m.gw.Stop)
	return nil
}

// gatewayBin is the gateway's distribution: the stock collector's for a
// stock gateway.
func (m *matrix) gatewayBin() string {
	if m.s.stock {
		return m.o.stockBin
	}
	return m.o.throttleBin
}

// relay starts a relay from the client's source address to the gateway
// endpoint and returns the address to send to.
func (m *matrix) relay(c clientSpec, target string) (string, error) {
	src, err := netip.ParseAddr(c.addr)
	if err != nil {
		return "", err
	}
	r, err := harness.StartRelay(src, target)
	if err != nil {
		return "", err
	}
	m.cleanups = append(m.cleanups, r.Close)
	return r.Addr(), nil
}

func (m *matrix) gatewayGRPC() string { return fmt.Sprintf("127.0.0.1:%d", m.gwCfg.GRPCPort) }
func (m *matrix) gatewayHTTP() string { return fmt.Sprintf("127.0.0.1:%d", m.gwCfg.HTTPPort) }

// startAgent starts the stock collector of an agent client, exporting to
// the gateway through a relay from the client's address.
func (m *matrix) startAgent(ctx context.Context, c clientSpec) (*agent, error) {
	ports, err := harness.FreePorts(2)
	if err != nil {
		return nil, err
	}
	ac := colconfig.Agent{Bench: "bench/clients", HTTPPort: ports[0], MetricsPort: ports[1]}
	if c.kind == colHTTP {
		addr, err := m.relay(c, m.gatewayHTTP())
		if err != nil {
			return nil, err
		}
		ac.Exporter, ac.Endpoint = "otlp_http", "http://"+addr
	} else {
		addr, err := m.relay(c, m.gatewayGRPC())
		if err != nil {
			return nil, err
		}
		ac.Exporter, ac.Endpoint = "otlp_grpc", addr
	}
	b, err := ac.Render()
	if err != nil {
		return nil, err
	}
	a := &agent{httpPort: ac.HTTPPort, logPath: m.path("log-agent-" + c.name() + ".txt")}
	// An agent drains its queue on SIGTERM for as long as its exporter
	// retries: it is stopped once its data is counted, with a short grace.
	a.col, err = harness.StartCollector(ctx, harness.CollectorConfig{
		Process: harness.ProcessConfig{Bin: m.o.stockBin, LogPath: a.logPath, Logf: logf},
		Config:  b, ConfigPath: m.path("config-agent-" + c.name() + ".yaml"), MetricsPort: ac.MetricsPort,
		ReadyTimeout: 30 * time.Second, ScrapeEvery: m.o.interval, StopGrace: 2 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	m.cleanups = append(m.cleanups, a.col.Stop)
	return a, nil
}

// startClient starts the process of client c: the Go SDK client or the
// feeder (this binary in another role), or node.
func (m *matrix) startClient(c clientSpec) (*clientProc, error) {
	p := &clientProc{spec: c, resultPath: m.path("result-" + c.name() + ".json"), logPath: m.path("log-client-" + c.name() + ".txt")}
	_ = os.Remove(p.resultPath)
	common := func(prefix string) []string {
		return []string{
			prefix + "id", strconv.FormatUint(uint64(c.id), 10), prefix + "name", c.name(),
			prefix + "workers", strconv.Itoa(c.workers), prefix + "batch", strconv.FormatUint(c.batch, 10),
			prefix + "rate", strconv.FormatFloat(c.rate, 'f', -1, 64),
			prefix + "attr-size", strconv.Itoa(c.attrSize), prefix + "result", p.resultPath,
		}
	}
	cfg := harness.ProcessConfig{LogPath: p.logPath, Logf: logUnlessExited}
	switch {
	case c.isGo():
		protocol, endpoint := "http", m.gatewayHTTP()
		if c.kind == goGRPC {
			protocol, endpoint = "grpc", m.gatewayGRPC()
		}
		cfg.Bin, cfg.Env = m.o.self, []string{roleEnv + "=" + roleGoSDK}
		cfg.Args = append(common("-"), "-duration", m.s.load.String(), "-protocol", protocol, "-endpoint", endpoint, "-bind", c.addr)
		cfg.Args = append(cfg.Args, c.sdkArgs...)
	case c.isJS():
		protocol, endpoint := "http", m.gatewayHTTP()
		args := []string{"--bind", c.addr}
		if c.kind == jsGRPC {
			addr, err := m.relay(c, m.gatewayGRPC())
			if err != nil {
				return nil, err
			}
			protocol, endpoint, args = "grpc", addr, nil
		}
		cfg.Bin = m.o.nodeBin
		cfg.Args = append([]string{filepath.Join(m.o.jsDir, "client.js")}, common("--")...)
		cfg.Args = append(cfg.Args, "--duration", strconv.FormatFloat(m.s.load.Seconds(), 'f', -1, 64),
			"--protocol", protocol, "--endpoint", endpoint)
		cfg.Args = append(cfg.Args, args...)
		cfg.Args = append(cfg.Args, c.nodeArgs...)
	case c.isAgent():
		cfg.Bin, cfg.Env = m.o.self, []string{roleEnv + "=" + roleFeeder}
		cfg.Args = append(common("-"), "-duration", m.s.load.String(),
			"-target", fmt.Sprintf("http://127.0.0.1:%d/v1/traces", m.agents[c.id].httpPort))
	}
	var err error
	if p.proc, err = harness.StartProcess(cfg); err != nil {
		return nil, fmt.Errorf("starting %s: %w", c.name(), err)
	}
	m.cleanups = append(m.cleanups, func() { p.proc.Stop(2 * time.Second) })
	return p, nil
}

// helper starts this binary in a helper role in some controllers of the
// gateway's cgroup and returns when it has ended.
func (m *matrix) helper(ctx context.Context, role string, controllers []string, args ...string) error {
	p, err := harness.StartProcess(harness.ProcessConfig{
		Bin: m.o.self, Args: args, Env: []string{roleEnv + "=" + role},
		Cgroup: m.cg, Controllers: controllers, LogPath: m.path("log-" + role + ".txt"), Logf: logUnlessExited,
	})
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Stop(time.Second)
	}
	if ex := p.Exits(); len(ex) > 0 && !strings.HasSuffix(ex[len(ex)-1], "exited") {
		return fmt.Errorf("%s: %s (see %s)", role, ex[len(ex)-1], m.path("log-"+role+".txt"))
	}
	return nil
}

// stress runs the scenario's CPU loads or memory pulses, from start.
func (m *matrix) stress(ctx context.Context, start time.Time) {
	for i, sp := range m.s.spells {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(start.Add(sp.start))):
		}
		m.rec.setStress(true)
		var err error
		switch m.s.stress {
		case stressBackend:
			logf("%s: the backend hangs for %s", m.s.name, sp.length)
			m.sink.hang(ctx, sp.length)
		case stressSlow:
			logf("%s: the backend takes %.0f spans/s for %s", m.s.name, m.s.sinkRate, sp.length)
			m.sink.slowDown(ctx, sp.length, m.s.sinkRate)
		case stressMemory:
			err = m.helper(ctx, roleMemPulse, []string{"memory"}, "-mem-dir", m.cg.MemoryDir(),
				"-target", strconv.FormatFloat(m.o.pulseTarget, 'f', -1, 64), "-hold", sp.length.String())
		default:
			err = m.helper(ctx, roleCPUBurn, []string{"cpu", "cpuacct"},
				"-cores", strconv.FormatFloat(m.o.burnShare*m.o.cpus, 'f', -1, 64), "-duration", sp.length.String())
		}
		m.rec.setStress(false)
		if err != nil {
			logf("%s: %s stress %d: %v", m.s.name, m.s.stress, i+1, err)
		}
	}
}

// waitClients waits for every client process to end by itself: the load's
// length and its last export's budget; then it stops what is left.
func (m *matrix) waitClients(ctx context.Context, start time.Time) {
	for _, p := range m.clients {
		deadline := start.Add(m.s.load + p.spec.exportBudget + 30*time.Second)
		if p.spec.isAgent() {
			deadline = start.Add(m.s.load + 30*time.Second)
		}
		select {
		case <-p.proc.Done():
		case <-ctx.Done():
		case <-time.After(time.Until(deadline)):
			logf("%s: %s did not end in time; stopping it", m.s.name, p.spec.name())
			p.killed = true
			p.proc.Stop(2 * time.Second)
		}
	}
}

// waitDrained waits until every agent has settled what it accepted (sent,
// or failed for good) with an empty queue, and then until the gateway's
// exporter queue is empty and the sink has not moved, each for settle;
// it gives up after drainMax.
func (m *matrix) waitDrained(ctx context.Context) (drained bool) {
	deadline := time.Now().Add(m.o.drainMax)
	tick := time.NewTicker(m.o.interval)
	defer tick.Stop()
	var quietSince time.Time
	lastSink := uint64(math.MaxUint64)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return false
		}
		settled := true
		for _, a := range m.agents {
			s, at := a.col.Scraper.Get()
			if at.IsZero() || time.Since(at) > 2*time.Second {
				settled = false
				continue
			}
			acc := zero(harness.Value(s, "otelcol_receiver_accepted_spans", nil))
			done := zero(harness.Value(s, "otelcol_exporter_sent_spans", nil)) + zero(harness.Value(s, "otelcol_exporter_send_failed_spans", nil)) +
				zero(harness.Value(s, "otelcol_exporter_enqueue_failed_spans", nil))
			if done < acc || zero(harness.Value(s, "otelcol_exporter_queue_size", nil)) != 0 {
				settled = false
			}
		}
		gs, at := m.gw.Scraper.Get()
		if at.IsZero() || time.Since(at) > 2*time.Second || zero(harness.Value(gs, "otelcol_exporter_queue_size", nil)) != 0 {
			settled = false
		}
		if n := m.sink.total(); n != lastSink {
			lastSink, settled = n, false
		}
		if !settled {
			quietSince = time.Time{}
			continue
		}
		if quietSince.IsZero() {
			quietSince = time.Now()
		}
		if time.Since(quietSince) >= m.o.settle {
			return true
		}
	}
}

// run runs the scenario: the clients for the load's length with the
// stress, then the drain; it returns the outcome per client.
func (m *matrix) run(ctx context.Context) (*runOutcome, error) {
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	m.rec.setPhase("load")
	start := time.Now()
	for _, c := range m.s.clients {
		p, err := m.startClient(c)
		if err != nil {
			return nil, err
		}
		m.clients = append(m.clients, p)
	}
	sctx, stopStress := context.WithCancel(ctx)
	stressDone := make(chan struct{})
	go func() { defer close(stressDone); m.stress(sctx, start) }()
	m.waitClients(ctx, start)
	stopStress()
	<-stressDone
	m.rec.setPhase("drain")
	drainStart := time.Now()
	drained := m.waitDrained(ctx)
	logf("%s: drain %s (%s)", m.s.name, map[bool]string{true: "done", false: "not done"}[drained], time.Since(drainStart).Round(time.Second))
	out := m.collect()
	out.Drained = drained
	out.Load = m.s.load
	return out, ctx.Err()
}

// logUnlessExited logs what the harness says of a client or helper
// process, but for its ending normally (they all end by themselves).
func logUnlessExited(format string, args ...any) {
	if msg := fmt.Sprintf(format, args...); !strings.HasSuffix(msg, "(exited)") {
		logf("%s", msg)
	}
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	last := ""
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			last = t
		}
	}
	return last
}

// zero is v, or 0 for a missing value: a counter never incremented is not
// exported at all.
func zero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

var errNoResult = errors.New("the client wrote no result")
