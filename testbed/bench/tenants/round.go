// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// roundSpec is one round: a gateway in a topology, and the tenants'
// rates.
type roundSpec struct {
	pair  pair
	round string // roundBaseline, roundNoisy, roundCapacity
	// rates are the tenants' spans/s; 0: the tenant does not send (no
	// agent is started for it).
	rates []float64
	// noisy is the index of the noisy tenant (-1: none).
	noisy  int
	memMiB uint64
}

// name is the round's name in file names and tables:
// proxy-throttle-tenant-noisy.
func (s roundSpec) name() string { return s.pair.name() + "-" + s.round }

// member is one tenant's agent, its tap and its load generator.
type member struct {
	i     int
	name  string
	agent *harness.Collector
	tap   *tap
	port  int // the agent's OTLP/HTTP port
}

// round is a running round: the sink, the gateway in its cgroup, the
// proxy, the tenants' taps and agents, and the recorder.
type round struct {
	o        options
	spec     roundSpec
	cleanups []func()
	// t0 is when the round started: its timeline's time 0.
	t0 time.Time

	sink    *sink
	cg      *harness.Cgroup
	gw      *harness.Collector
	proxy   *haproxy.Proxy
	members []*member
	rec     *recorder
}

// stop stops everything started, in reverse order, by PID, and removes
// the cgroup.
func (r *round) stop() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// quiet reports whether tenant i is a quiet one of the round.
func (r *round) quiet(i int) bool { return i != r.spec.noisy }

func (r *round) path(format string, a ...any) string {
	return filepath.Join(r.o.out, fmt.Sprintf(format, a...))
}

// startRound starts a round's parts and its recorder, writing to tw. On
// error, what was started is stopped.
func startRound(ctx context.Context, o options, spec roundSpec, tw *harness.CSVFile) (_ *round, err error) {
	r := &round{o: o, spec: spec, t0: time.Now()}
	defer func() {
		if err != nil {
			r.stop()
		}
	}()
	var names []string
	for i := range spec.rates {
		names = append(names, tenantName(i))
	}
	if r.sink, err = startSink(names); err != nil {
		return nil, err
	}
	r.cleanups = append(r.cleanups, r.sink.close)
	if r.cg, err = harness.CreateCgroup(fmt.Sprintf("throttle-tenants-%d-%s", os.Getpid(), spec.name()), o.cpus, spec.memMiB<<20); err != nil {
		return nil, err
	}
	r.cleanups = append(r.cleanups, func() { r.cg.Remove(logf) })
	ports, err := harness.FreePorts(4)
	if err != nil {
		return nil, err
	}
	gw := colconfig.Gateway{
		Bench: "bench/tenants", Kind: spec.pair.gw.kind, ThrottleYAML: spec.pair.gw.throttle, MemoryLimiter: colconfig.MemoryLimiterYAML,
		HTTPPort: ports[0], GRPCPort: ports[1], MetricsPort: ports[2], PprofPort: ports[3], SinkHTTPPort: r.sink.port(),
		// The sink is in this process: compressing for it would cost the
		// gateway's quota and the machine's cores for nothing.
		Compression: "none",
	}
	cfg, err := gw.Render()
	if err != nil {
		return nil, err
	}
	logf("%s: gateway %s in cgroup v%d (%.2g CPU, %d MiB)", spec.name(), spec.pair.gw.name, r.cg.Version, o.cpus, spec.memMiB)
	if r.gw, err = harness.StartCollector(ctx, harness.CollectorConfig{
		Process: harness.ProcessConfig{
			Bin: o.binFor(spec.pair.gw.kind), Cgroup: r.cg, LogPath: r.path("log-%s-gateway.txt", spec.name()),
			Restart: true, RestartDelay: time.Second, Logf: logf,
		},
		Config: cfg, ConfigPath: r.path("config-%s-gateway.yaml", spec.name()), MetricsPort: gw.MetricsPort,
		ReadyTimeout: 30 * time.Second, ScrapeEvery: o.interval, StopGrace: 5 * time.Second,
	}); err != nil {
		return nil, fmt.Errorf("starting the gateway: %w", err)
	}
	r.cleanups = append(r.cleanups, r.gw.Stop)

	target := fmt.Sprintf("http://127.0.0.1:%d", gw.HTTPPort)
	if spec.pair.topology == topoProxy {
		port, err := harness.FreePort()
		if err != nil {
			return nil, err
		}
		pc := proxyConfig{Port: port, GatewayPort: gw.HTTPPort, Source: proxyAddr.String(), TimeoutClientServer: proxyTimeout}
		if r.proxy, err = haproxy.Start(ctx, haproxy.Config{
			Bin: o.haproxyBin,
			Render: func(socket string) ([]byte, error) {
				pc.Socket = socket
				return colconfig.Render(proxyTmpl, pc)
			},
			ConfigPath: r.path("config-%s-proxy.cfg", spec.name()), LogPath: r.path("log-%s-proxy.txt", spec.name()), Logf: logf,
		}); err != nil {
			return nil, err
		}
		r.cleanups = append(r.cleanups, r.proxy.Stop)
		target = fmt.Sprintf("http://127.0.0.1:%d", port)
	}
	if err := r.startMembers(ctx, target); err != nil {
		return nil, err
	}
	r.rec = newRecorder(r, tw)
	r.cleanups = append(r.cleanups, harness.Background(func(ctx context.Context) { harness.Every(ctx, o.interval, r.rec.sample) }))
	return r, nil
}

// startMembers starts the taps and the agents of the tenants that send,
// the agents side by side.
func (r *round) startMembers(ctx context.Context, target string) error {
	for i, rate := range r.spec.rates {
		if rate <= 0 {
			continue
		}
		t, err := startTap(tenantName(i), tenantAddr(i), target)
		if err != nil {
			return err
		}
		r.cleanups = append(r.cleanups, t.close)
		r.members = append(r.members, &member{i: i, name: tenantName(i), tap: t})
	}
	ports, err := harness.FreePorts(2 * len(r.members))
	if err != nil {
		return err
	}
	errs := make([]error, len(r.members))
	var wg sync.WaitGroup
	for j, m := range r.members {
		m.port = ports[2*j]
		ac := colconfig.Agent{
			Bench: "bench/tenants", HTTPPort: m.port, MetricsPort: ports[2*j+1], Exporter: "otlp_http",
			Endpoint: m.tap.url(), Compression: r.o.agentCompression, Headers: map[string]string{tenantHeader: m.name},
		}
		cfg, err := ac.Render()
		if err != nil {
			return err
		}
		wg.Go(func() {
			m.agent, errs[j] = harness.StartCollector(ctx, harness.CollectorConfig{
				Process:      harness.ProcessConfig{Bin: r.o.stockBin, LogPath: r.path("log-%s-%s.txt", r.spec.name(), m.name), Logf: logf},
				Config:       cfg,
				ConfigPath:   r.path("config-%s-%s.yaml", r.spec.name(), m.name),
				MetricsPort:  ac.MetricsPort,
				ReadyTimeout: 30 * time.Second, ScrapeEvery: r.o.interval,
				// An agent drains its queue on SIGTERM, for as long as its
				// exporter retries: what it holds then is counted, so it
				// gets a short grace.
				StopGrace: 2 * time.Second,
			})
		})
	}
	wg.Wait()
	for _, m := range r.members {
		if m.agent != nil {
			r.cleanups = append(r.cleanups, m.agent.Stop)
		}
	}
	return errors.Join(errs...)
}

// loadWindow is when the load generators sent the load phase: from the
// latest start of their load phases to the earliest end.
type loadWindow struct{ start, end time.Time }

func (w loadWindow) contains(t time.Time) bool { return !t.Before(w.start) && t.Before(w.end) }

// seconds is the window's length.
func (w loadWindow) seconds() float64 { return w.end.Sub(w.start).Seconds() }

// load runs one open-loop load generator per tenant that sends, at its
// rate: a warmup, then the load, and returns what each sent (by tenant
// index) and the load phase's window.
func (r *round) load(ctx context.Context, warmup, length time.Duration) (map[int]loadgen.Counts, loadWindow, error) {
	runners := make([]*loadgen.Runner, len(r.members))
	for j, m := range r.members {
		perSec := r.spec.rates[m.i] / float64(r.o.spans)
		ph := []loadgen.Phase{{Name: "load", Duration: length, Rate: perSec, MaxInflight: 256, Items: r.o.spans, AttrSize: r.o.attrSize}}
		if warmup > 0 {
			ph = slices.Insert(ph, 0, loadgen.Phase{Name: "warmup", Duration: warmup, Rate: perSec, MaxInflight: 256, Items: r.o.spans, AttrSize: r.o.attrSize})
		}
		sigs, _ := loadgen.ParseSignals("traces")
		var err error
		if runners[j], err = loadgen.New(loadgen.Config{
			Target: fmt.Sprintf("http://127.0.0.1:%d", m.port), Protocol: loadgen.HTTP, Signals: sigs,
			Timeout: 10 * time.Second, Phases: ph, Resource: map[string]string{tenantAttr: m.name},
		}); err != nil {
			return nil, loadWindow{}, err
		}
	}
	out, err := os.OpenFile(r.path("loadgen-%s.txt", r.spec.name()), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, loadWindow{}, err
	}
	defer out.Close()
	var mu sync.Mutex
	reps := make([]*loadgen.Report, len(runners))
	errs := make([]error, len(runners))
	var wg sync.WaitGroup
	for j, rn := range runners {
		wg.Go(func() {
			var b lockedBuffer
			reps[j], errs[j] = rn.Run(ctx, &b)
			mu.Lock()
			fmt.Fprintf(out, "%s:\n%s", r.members[j].name, b.String())
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, loadWindow{}, err
	}
	counts := map[int]loadgen.Counts{}
	var w loadWindow
	for j, rep := range reps {
		var c loadgen.Counts
		for _, p := range rep.Phases {
			c.Add(p.Total)
			if p.Phase.Name != "load" {
				continue
			}
			if w.start.IsZero() || p.Start.After(w.start) {
				w.start = p.Start
			}
			if end := p.Start.Add(p.Issuing); w.end.IsZero() || end.Before(w.end) {
				w.end = end
			}
		}
		counts[r.members[j].i] = c
	}
	return counts, w, nil
}

// lockedBuffer is a load generator's output, written by its goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// agentFlow is what an agent's own metrics count, in spans.
type agentFlow struct {
	fresh                                            bool
	accepted, sent, sendFailed, enqueueFailed, queue float64
}

// settled reports whether the agent has sent, or given up on, everything
// it accepted.
func (a agentFlow) settled() bool {
	return a.fresh && a.sent+a.sendFailed+a.enqueueFailed >= a.accepted && a.queue == 0
}

// flowOf reads an agent's last scrape (fresh: within 2 s).
func flowOf(c *harness.Collector, now time.Time) agentFlow {
	s, at := c.Scraper.Get()
	v := func(name string) float64 { return zero(harness.Value(s, name, nil)) }
	return agentFlow{
		fresh: !at.IsZero() && now.Sub(at) < 2*time.Second, accepted: v("otelcol_receiver_accepted_spans"),
		sent: v("otelcol_exporter_sent_spans"), sendFailed: v("otelcol_exporter_send_failed_spans"),
		enqueueFailed: v("otelcol_exporter_enqueue_failed_spans"), queue: v("otelcol_exporter_queue_size"),
	}
}

// zero is v, or 0 for a missing value: a counter never incremented is not
// exported at all.
func zero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// drain waits until every quiet tenant's agent has settled what it
// accepted and its queue is empty, and the sink has counted nothing more
// of the quiet tenants, both for -settle; at most -drain-max. The noisy
// tenant's agent is not waited for: refused, it may retry its backlog for
// minutes, which is its own. It returns how long after from the quiet
// tenants' last span arrived, and whether they drained.
func (r *round) drain(ctx context.Context, from time.Time) (time.Duration, bool) {
	deadline := time.NewTimer(r.o.drainMax)
	defer deadline.Stop()
	tick := time.NewTicker(r.o.interval)
	defer tick.Stop()
	last, lastMove := int64(-1), time.Now()
	var settledSince time.Time
	for {
		select {
		case <-ctx.Done():
			return time.Since(from), false
		case <-deadline.C:
			return time.Since(from), false
		case <-tick.C:
		}
		now := time.Now()
		snap := r.sink.snapshot()
		var quiet int64
		settled := true
		for _, m := range r.members {
			if !r.quiet(m.i) {
				continue
			}
			quiet += snap[m.name]
			settled = settled && flowOf(m.agent, now).settled()
		}
		if quiet != last {
			last, lastMove = quiet, now
		}
		if !settled {
			settledSince = time.Time{}
			continue
		}
		if settledSince.IsZero() {
			settledSince = now
		}
		if now.Sub(settledSince) >= r.o.settle && now.Sub(lastMove) >= r.o.settle {
			return lastMove.Sub(from), true
		}
	}
}
