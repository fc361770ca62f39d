// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// run measures the capacity unless given, then runs every pair's
// baseline and noisy rounds and writes the results and the report.
func run(o options) error {
	if err := o.prepare(); err != nil {
		return err
	}
	ps := pairs(o.topologies, o.gateways)
	roundLen := o.warmup + o.round + o.drainMax + time.Minute
	budget := 2*time.Minute + time.Duration(2*len(ps))*roundLen
	if o.capacity <= 0 {
		budget += time.Duration(o.capSteps.MaxSteps)*(o.capSteps.Step+20*time.Second) + 2*o.capSteps.Step + time.Minute
	}
	ctx, cancel := harness.RunContext(budget)
	defer cancel()
	logf("results in %s; whole run bounded to %s", o.out, budget.Round(time.Second))
	tw, err := harness.CreateCSV(filepath.Join(o.out, timelineFile), timelineHeader(o.tenants))
	if err != nil {
		return err
	}
	defer tw.Close()
	ew, err := harness.CreateCSV(filepath.Join(o.out, exportsFile), exportsHeader)
	if err != nil {
		return err
	}
	defer ew.Close()

	measured := o.capacity <= 0
	if measured {
		c, err := measureCapacity(ctx, o, tw)
		if err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
		o.capacity = c
		logf("capacity of the gateway: %.0f spans/s (-capacity %.0f to reuse it)", c, c)
	}
	s := o.setup()
	s.Measured = measured
	if err := writeJSON(filepath.Join(o.out, setupFile), s); err != nil {
		return err
	}
	var results []*roundResult
	for _, p := range ps {
		for _, kind := range []string{roundBaseline, roundNoisy} {
			res, err := runRound(ctx, o, s.spec(p, kind), tw, ew)
			if res != nil {
				results = append(results, res)
				if err := writeJSON(filepath.Join(o.out, resultsFile), results); err != nil {
					return err
				}
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", p.name(), kind, err)
			}
		}
	}
	return writeReport(o.out)
}

// setup is what a run measured and offered: the report's header and what
// -report reads back.
type setup struct {
	Tenants     int     `json:"tenants"`
	Noisy       int     `json:"noisy"` // index of the noisy tenant
	NoisyFactor float64 `json:"noisy_factor"`
	Load        float64 `json:"load"`
	Capacity    float64 `json:"capacity"`
	// Measured: the capacity was measured in this run (capacity.md).
	Measured      bool     `json:"measured"`
	Rate          float64  `json:"rate"` // a quiet tenant's spans/s
	CPUs          float64  `json:"cpus"`
	MemMiB        uint64   `json:"mem_mib"`
	WarmupSeconds float64  `json:"warmup_s"`
	RoundSeconds  float64  `json:"round_s"`
	DrainMaxSecs  float64  `json:"drain_max_s"`
	Spans         int      `json:"spans"`
	AttrSize      int      `json:"attr_size"`
	Compression   string   `json:"agent_compression"`
	ProxyAddr     string   `json:"proxy_addr"`
	Pairs         []string `json:"pairs"`
}

func (o options) setup() setup {
	s := setup{
		Tenants: o.tenants, Noisy: o.tenants - 1, NoisyFactor: o.noisyFactor, Load: o.load, Capacity: o.capacity,
		Rate: o.load * o.capacity / float64(o.tenants),
		CPUs: o.cpus, MemMiB: o.memMiB, WarmupSeconds: o.warmup.Seconds(), RoundSeconds: o.round.Seconds(),
		DrainMaxSecs: o.drainMax.Seconds(), Spans: o.spans, AttrSize: o.attrSize, Compression: o.agentCompression,
		ProxyAddr: proxyAddr.String(),
	}
	for _, p := range pairs(o.topologies, o.gateways) {
		s.Pairs = append(s.Pairs, p.name())
	}
	return s
}

// spec is the round of kind of pair: the quiet tenants at the rate, the
// noisy one at noisyFactor times it or not at all.
func (s setup) spec(p pair, kind string) roundSpec {
	rs := roundSpec{pair: p, round: kind, noisy: s.Noisy, memMiB: s.MemMiB}
	for i := range s.Tenants {
		switch {
		case i != s.Noisy:
			rs.rates = append(rs.rates, s.Rate)
		case kind == roundNoisy:
			rs.rates = append(rs.rates, s.NoisyFactor*s.Rate)
		default:
			rs.rates = append(rs.rates, 0)
		}
	}
	return rs
}

// runRound runs one round on fresh parts: the warmup and the load window
// at the tenants' rates, the drain, and returns its figures.
func runRound(ctx context.Context, o options, spec roundSpec, tw, ew *harness.CSVFile) (*roundResult, error) {
	r, err := startRound(ctx, o, spec, tw)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	r.rec.setPhase("warmup")
	toLoad := time.AfterFunc(o.warmup, func() { r.rec.setPhase("load") })
	counts, w, err := r.load(ctx, o.warmup, o.round)
	toLoad.Stop()
	if err != nil {
		return nil, err
	}
	end := time.Now()
	r.rec.setPhase("drain")
	drained, ok := r.drain(ctx, w.end)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	res := &roundResult{
		Name: spec.name(), Topology: spec.pair.topology, Gateway: spec.pair.gw.name, Round: spec.round,
		WindowSeconds: num(w.seconds()), Drained: ok, DrainSeconds: num(drained.Seconds()),
	}
	pts := r.rec.snapshot()
	gatewayFigures(res, pts, w, o.interval)
	gs, _ := r.gw.Scraper.Get()
	if spec.pair.gw.kind == colconfig.KindThrottle {
		reason := func(v string) map[string]string { return map[string]string{"decision": "denied", "reason": v} }
		res.Allowed = num(harness.Value(gs, "otelcol_throttle_requests", map[string]string{"decision": "allowed"}))
		res.DeniedShed = num(zero(harness.Value(gs, "otelcol_throttle_requests", reason("shed"))))
		res.DeniedOpen = num(zero(harness.Value(gs, "otelcol_throttle_requests", reason("open"))))
		res.DeniedBudget = num(zero(harness.Value(gs, "otelcol_throttle_requests", reason("budget"))))
		res.CutOff = map[string]num{}
		for _, c := range cutReasons {
			res.CutOff[c] = num(zero(harness.Value(gs, "otelcol_throttle_cut_off_requests", map[string]string{"reason": c})))
		}
	} else {
		res.Allowed, res.DeniedShed, res.DeniedOpen, res.DeniedBudget = num(math.NaN()), num(math.NaN()), num(math.NaN()), num(math.NaN())
	}
	snap := r.sink.snapshot()
	res.SinkOther, res.SinkBad = snap[otherTenant], r.sink.bad.Load()
	at := make([]time.Time, len(pts))
	for i, p := range pts {
		at[i] = p.at
	}
	var quietLat []float64
	for _, m := range r.members {
		c := counts[m.i]
		fl := flowOf(m.agent, time.Now())
		t := tenantResult{
			Tenant: m.name, Noisy: m.i == spec.noisy, Rate: num(spec.rates[m.i]),
			Offered: c.SentItems, GenRefused: c.SentItems - c.AcceptedItems,
			AgentAccepted: num(fl.accepted), AgentSent: num(fl.sent), AgentSendFailed: num(fl.sendFailed),
			AgentEnqueueFailed: num(fl.enqueueFailed), AgentQueue: num(fl.queue), Delivered: snap[m.name],
		}
		sinkCounts := make([]int64, len(pts))
		for i, p := range pts {
			sinkCounts[i] = p.sink[m.name]
		}
		t.WindowRate = num(windowRate(at, sinkCounts, w))
		exports := m.tap.snapshot()
		lat := tapFigures(&t, exports, w)
		if !t.Noisy {
			quietLat = append(quietLat, lat...)
		}
		for _, e := range exports {
			ew.Write(exportRow(spec.name(), m.name, r.t0, e))
		}
		res.Tenants = append(res.Tenants, t)
	}
	_ = ew.Flush()
	res.QuietOK = len(quietLat)
	res.QuietP50Ms, res.QuietP99Ms = num(percentile(slices.Clone(quietLat), 50)), num(percentile(quietLat, 99))
	logf("%s: quiet p99 %s ms (%d exports), host busy %s %%, gateway CPU %s %% of its quota, OOM kills %d, drained %v (%s after the load), load ended %s",
		spec.name(), opt(float64(res.QuietP99Ms), 1), res.QuietOK, opt(float64(res.HostMeanPct), 0), opt(float64(res.CPUMeanPct), 0),
		res.OOMKills, ok, drained.Round(time.Second), end.Format("15:04:05"))
	return res, nil
}

// measureCapacity finds the spans/s the gateway's CPU quota delivers: the
// stock gateway (memory enough not to matter) fed by every tenant alike
// with no proxy, an open loop stepped up until the sink's rate stops
// growing, as the fleet steps it. The highest step it kept up with before
// it first fell behind is then offered again to a fresh gateway, and the
// capacity is the rate delivered there scaled to the whole quota by the
// share of it the gateway used (at least half): on a shared machine the
// agents or the load generators, not the gateway, may be what limits the
// steps past it, and a stock gateway offered more than it takes delivers
// less than it could. The steps go to capacity.md.
func measureCapacity(ctx context.Context, o options, tw *harness.CSVFile) (float64, error) {
	var steps bytes.Buffer
	capacity, err := findCapacity(ctx, o, tw, io.MultiWriter(os.Stdout, &steps))
	if werr := os.WriteFile(filepath.Join(o.out, capacityFile), steps.Bytes(), 0o644); err == nil {
		err = werr
	}
	return capacity, err
}

func findCapacity(ctx context.Context, o options, tw *harness.CSVFile, out io.Writer) (float64, error) {
	spec := func(name string) roundSpec {
		rs := roundSpec{
			pair:  pair{topology: topoDirect, gw: gateway{name: name, kind: colconfig.KindStock}},
			round: roundCapacity, noisy: -1, memMiB: max(o.memMiB, 1024),
		}
		for range o.tenants {
			rs.rates = append(rs.rates, 1) // only that each tenant sends
		}
		return rs
	}
	r, err := startRound(ctx, o, spec("stock"), tw)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(out, "\nCapacity of the gateway (%.2g CPU, stock, memory not limiting; %d tenants' agents alike, no proxy, %d-span requests):\n\n", o.cpus, o.tenants, o.spans)
	search, err := o.capSteps.Search(ctx, func(ctx context.Context, rate float64, _ int) (float64, error) {
		r.rec.setPhase(fmt.Sprintf("capacity %.0f", rate))
		got, cpu, err := r.offerCPU(ctx, rate, o.capSteps.Step)
		logf("capacity: %.0f spans/s offered, %.0f delivered, the gateway at %.0f %% of its CPU quota", rate, got, 100*cpu)
		return got, err
	}, out)
	r.stop()
	if err != nil {
		return 0, err
	}
	if search.Best <= 0 {
		return 0, fmt.Errorf("nothing delivered (see %s)", o.out)
	}
	rate := search.KeptUp
	if rate <= 0 {
		rate = search.BestOffered
	}
	again, err := startRound(ctx, o, spec("stock-again"), tw)
	if err != nil {
		return 0, err
	}
	defer again.stop()
	again.rec.setPhase("capacity again")
	got, cpu, err := again.offerCPU(ctx, rate, 2*o.capSteps.Step)
	if err != nil {
		return 0, err
	}
	capacity := got / min(max(cpu, minCapacityCPU), 1)
	fmt.Fprintf(out, "\nBest step: %.0f spans/s, at %.0f offered; the highest step kept up with before the first that fell behind: %.0f offered. "+
		"That rate offered again to a fresh gateway for %s delivered %.0f spans/s over its second half, with the gateway at %.0f %% of its CPU quota.\n",
		search.Best, search.BestOffered, search.KeptUp, 2*o.capSteps.Step, got, 100*cpu)
	if capacity <= 0 {
		return 0, fmt.Errorf("nothing delivered when the capacity was measured again (see %s)", o.out)
	}
	fmt.Fprintf(out, "\nCapacity: %.0f spans/s (%.0f over %.0f %% of the quota).\n", capacity, got, 100*min(max(cpu, minCapacityCPU), 1))
	return capacity, nil
}

// minCapacityCPU bounds how far a capacity is extrapolated from the CPU a
// gateway used: at most twice what it delivered.
const minCapacityCPU = 0.5

// offerCPU offers rate spans/s, shared alike by the round's tenants, for
// length, and returns the spans/s the sink received over its second half
// and the gateway's CPU then, as a share of its quota.
func (r *round) offerCPU(ctx context.Context, rate float64, length time.Duration) (got, cpu float64, err error) {
	for i := range r.spec.rates {
		r.spec.rates[i] = rate / float64(len(r.spec.rates))
	}
	total := func() int64 {
		var n int64
		for _, c := range r.sink.snapshot() {
			n += c
		}
		return n
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := r.load(ctx, 0, length)
		done <- err
	}()
	select {
	case <-time.After(length / 2):
	case err := <-done:
		return 0, 0, err
	}
	c1, t1 := total(), time.Now()
	s1, err1 := r.cg.Stats()
	if err := <-done; err != nil {
		return 0, 0, err
	}
	c2, t2 := total(), time.Now()
	s2, err2 := r.cg.Stats()
	if !t2.After(t1) {
		return 0, 0, nil
	}
	secs := t2.Sub(t1).Seconds()
	if err1 == nil && err2 == nil {
		cpu = (s2.CPUUsage - s1.CPUUsage).Seconds() / (secs * r.o.cpus)
	}
	return float64(c2-c1) / secs, cpu, nil
}

// cutReasons are the reasons of otelcol_throttle_cut_off_requests, in the
// report's order.
var cutReasons = func() []string {
	r := make([]string, admission.NumCutReasons)
	for i := range r {
		r[i] = admission.CutReason(i).String()
	}
	return r
}()
