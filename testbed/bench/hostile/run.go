// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// runResult is a whole run.
type runResult struct {
	rounds     []*roundResult
	capacity   float64
	reportPath string
}

// defaultOut is bench/runs/<UTC date>-hostile, or the first of -2, -3...
// not taken.
func defaultOut() string {
	base := filepath.Join("bench", "runs", time.Now().UTC().Format("2006-01-02")+"-hostile")
	out := base
	for i := 2; ; i++ {
		if _, err := os.Stat(out); errors.Is(err, os.ErrNotExist) {
			return out
		}
		out = fmt.Sprintf("%s-%d", base, i)
	}
}

// commit names the checkout's commit, "+dirty" when it has changes.
func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && strings.TrimSpace(string(st)) != "" {
		c += "+dirty"
	}
	return c
}

// writers are the run's CSV files.
type writers struct {
	timeline, answers, hostile *harness.CSVFile
}

func (w *writers) close() error {
	return errors.Join(w.timeline.Close(), w.answers.Close(), w.hostile.Close())
}

var answersHeader = []string{"round", "scenario", "who", "sent_s", "latency_ms", "class", "items", "message"}

// run measures the capacity (unless given), then runs every round, and
// writes the report. The rounds measured so far are returned with an
// error too.
func run(ctx context.Context, o *options, args []string) (*runResult, error) {
	if o.out == "" {
		o.out = defaultOut()
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return nil, err
	}
	machine := harness.MachineInfo(args) + "commit      " + commit() + "\n"
	if err := os.WriteFile(filepath.Join(o.out, "machine.txt"), []byte(machine), 0o644); err != nil {
		return nil, err
	}
	logf("results in %s", o.out)
	var w writers
	var err error
	if w.timeline, err = harness.CreateCSV(filepath.Join(o.out, "timeline.csv"), timelineHeader); err != nil {
		return nil, err
	}
	if w.answers, err = harness.CreateCSV(filepath.Join(o.out, "answers.csv"), answersHeader); err != nil {
		return nil, err
	}
	if w.hostile, err = harness.CreateCSV(filepath.Join(o.out, "hostile.csv"), answersHeader); err != nil {
		return nil, err
	}
	res := &runResult{}
	err = runRounds(ctx, o, &w, res)
	err = errors.Join(err, w.close())
	if len(res.rounds) > 0 {
		res.reportPath = filepath.Join(o.out, "report.md")
		err = errors.Join(err, writeReport(o.out))
	}
	return res, err
}

func runRounds(ctx context.Context, o *options, w *writers, res *runResult) error {
	s, err := startSink()
	if err != nil {
		return err
	}
	defer s.stop()
	logf("building the hostile payloads")
	payloads, err := buildPayloads(o)
	if err != nil {
		return err
	}
	res.capacity = o.capacity
	measured := o.capacity <= 0
	if measured {
		if res.capacity, err = measureCapacity(ctx, o, s, w); err != nil {
			return fmt.Errorf("measuring the capacity: %w", err)
		}
	}
	if res.capacity <= 0 {
		return errors.New("the gateway accepted nothing in the capacity measurement")
	}
	if err := writeSetup(o, res.capacity, measured, payloads); err != nil {
		return err
	}
	idx := 1
	for range o.repeat {
		for _, sc := range o.scenarios {
			st := setupFor(o, sc)
			base, err := runRound(ctx, o, idx, scenarioBaseline, st, 0, res.capacity, s, payloads, w)
			if err != nil {
				return err
			}
			res.rounds = append(res.rounds, base)
			r, err := runRound(ctx, o, idx+1, sc, st, idx, res.capacity, s, payloads, w)
			if err != nil {
				return err
			}
			r.baselineItemsS = base.acceptedItemsS
			r.baselineRefused, _ = base.refusedShares()
			res.rounds = append(res.rounds, r)
			idx += 2
			if err := writeSummary(o.out, res.rounds); err != nil {
				return err
			}
		}
	}
	return nil
}

// normalCfg is the normal clients' configuration for gateway g.
func normalCfg(o *options, g *gateway) normalConfig {
	return normalConfig{
		httpTarget: g.httpURL, grpcTarget: g.grpcAddr, items: o.items, attrSize: o.attrSize,
		timeout: o.timeout, maxInflight: o.maxInflight, grpcConns: 2,
	}
}

// capacityWarmup is the start of the capacity measurement that does not
// count: the gateway's first seconds (connections, learnt sizes, the CPU
// average).
const capacityWarmup = 3 * time.Second

// measureCapacity runs the normal clients in closed loop against a fresh
// gateway and returns the items per second it accepted.
func measureCapacity(ctx context.Context, o *options, s *sink, w *writers) (float64, error) {
	const name = "r00-capacity"
	g, err := startGateway(ctx, o, name, s.Addr(), setupFor(o, scenarioBaseline).gw)
	if err != nil {
		return 0, err
	}
	defer g.stop()
	start := time.Now()
	nc, err := newNormalClients(ctx, normalCfg(o, g), start)
	if err != nil {
		return 0, err
	}
	defer nc.close()
	smp := newSampler(0, "capacity", start, o.cpus, g, nc, newPeer(start), w.timeline)
	smp.start(o.interval)
	defer smp.stop()
	logf("%s: closed loop, %d requests in flight per protocol, %s", name, o.capacityC, capacityWarmup+o.capacityDur)
	lctx, cancel := context.WithTimeout(ctx, capacityWarmup+o.capacityDur)
	defer cancel()
	var wg sync.WaitGroup
	smp.setPhase("load")
	for _, proto := range []string{"http", "grpc"} {
		wg.Go(func() { nc.closedLoop(lctx, proto, o.capacityC) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	accepted := 0
	for _, a := range nc.snapshot() {
		if a.sent >= capacityWarmup && a.done > 0 && a.done <= capacityWarmup+o.capacityDur {
			accepted += a.items
		}
	}
	c := float64(accepted) / o.capacityDur.Seconds()
	logf("%s: capacity %.0f items/s", name, c)
	return c, nil
}

// runRound runs one round of scenario against a fresh gateway of st: the
// normal clients' warmup, then the load phase with the hostile peer (and
// st's honest batch client from its start), then a second of drain. A
// round of a shutdown setup ends its load phase -shutdown-after in with a
// SIGTERM to the gateway and times its exit.
func runRound(ctx context.Context, o *options, idx int, scenario string, st setup, pair int, capacity float64, s *sink, hp *hostilePayloads, w *writers) (*roundResult, error) {
	name := fmt.Sprintf("r%02d-%s", idx, scenario)
	g, err := startGateway(ctx, o, name, s.Addr(), st.gw)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	start := time.Now()
	nc, err := newNormalClients(ctx, normalCfg(o, g), start)
	if err != nil {
		return nil, err
	}
	defer nc.close()
	pr := newPeer(start)
	smp := newSampler(idx, scenario, start, st.gw.cpus, g, nc, pr, w.timeline)
	smp.start(o.interval)
	stopped := false
	defer func() {
		if !stopped {
			smp.stop()
		}
	}()
	itemsS := o.loadShare * capacity
	rate := itemsS / 2 / float64(o.items) // per protocol
	logf("%s: normal clients at %.0f items/s (%.1f requests/s over HTTP and as many over gRPC)", name, itemsS, rate)

	// The normal clients run through the warmup and the load phase; their
	// requests in flight at its end are answered and counted.
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	for _, proto := range []string{"http", "grpc"} {
		wg.Go(func() { nc.openLoop(loadCtx, proto, rate) })
	}
	sleep(ctx, o.warmup)
	smp.setPhase("load")
	from := time.Since(start)
	var bc *batchClient
	if st.batchBytes > 0 {
		bc = newBatchClient(g.httpURL, hp.batches[st.batchBytes], st.batchCycle, o.timeout, start)
		wg.Go(func() { bc.run(loadCtx, ctx) })
	}
	budget := g.budgetLimit()
	if budget <= 0 {
		budget = 10 << 20 // the shipped auto budget of a 1-CPU gateway
	}
	_, decoded := nc.bodySizes()
	env := &peerEnv{o: o, peer: pr, httpAddr: strings.TrimPrefix(g.httpURL, "http://"), grpcAddr: g.grpcAddr, budget: budget, normalDecoded: decoded, payloads: hp}
	hctx, stopPeer := context.WithCancel(ctx)
	var peerErr error
	peerDone := make(chan struct{})
	go func() { defer close(peerDone); peerErr = runPeer(hctx, scenario, env) }()
	window := o.duration
	var exitAfter time.Duration
	var exitKilled bool
	if st.shutdown {
		window = o.shutdownAfter
		sleep(ctx, window)
		logf("%s: SIGTERM to the gateway", name)
		exitAfter, exitKilled = g.col.Terminate(o.shutdownGrace)
		logf("%s: the gateway exited %.1f s after its SIGTERM (killed: %t)", name, exitAfter.Seconds(), exitKilled)
	} else {
		sleep(ctx, window)
	}
	stopLoad()
	stopPeer()
	<-peerDone
	wg.Wait()
	smp.setPhase("drain")
	sleep(ctx, time.Second)
	smp.stop()
	stopped = true
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if peerErr != nil {
		return nil, fmt.Errorf("%s: the hostile peer: %w", name, peerErr)
	}
	r := &roundResult{
		round: idx, scenario: scenario, pair: pair, window: window, offeredItemsS: itemsS, budget: budget,
		peakWS: smp.peakWS, limit: smp.limit, oomKills: smp.oomKills,
		gateway: st.gw.String(), target: st.target, shutdown: st.shutdown, exitAfter: exitAfter, exitKilled: exitKilled,
		peakReserved: smp.peakReserved, hostBusyPct: smp.hostBusy(),
	}
	_, _, r.restarts = g.col.Proc.State()
	normal, hostile := nc.snapshot(), pr.snapshot()
	var batch []answer
	if bc != nil {
		batch = bc.snapshot()
	}
	r.analyse(normal, batch, hostile, from)
	if scenario == scenarioBaseline {
		r.baselineItemsS = r.acceptedItemsS
	}
	for _, set := range []struct {
		f  *harness.CSVFile
		as []answer
	}{{w.answers, normal}, {w.answers, batch}, {w.hostile, hostile}} {
		for _, a := range set.as {
			set.f.Write(answerRow(idx, scenario, a))
		}
	}
	n, h := r.refusedShares()
	logf("%s: normal %.0f items/s accepted (%d answers, %d refused: budget %d, shed %d, open %d, other %d; %d errors), longest budget stretch %s; hostile %d requests: %d refused, %d admitted, %d held; peak working set %.0f MiB, OOM kills %d, restarts %d (refused: normal %.1f %%, hostile %.1f %%)",
		name, r.acceptedItemsS, r.answered(), refusals(&r.normal), r.normal[classBudget], r.normal[classShed], r.normal[classOpen], r.normal[classRefused], r.normal[classError],
		r.longestBudget.Round(time.Millisecond), total(&r.hostile), refusals(&r.hostile), r.hostile[classOK], r.hostile[classHeld],
		float64(r.peakWS)/(1<<20), r.oomKills, r.restarts, 100*n, 100*h)
	if r.batchKind != "" {
		share, _ := r.batchAccepted()
		logf("%s: honest %s: %d of %d accepted (%.1f %%)", name, r.batchKind, r.batch[classOK], total(&r.batch), 100*share)
	}
	if m, ok := r.targetResult(); m != "" {
		logf("%s: target %s: %s (reached: %t); peak reserved %.1f MiB; host busy %.0f %%", name, r.target.describe(), m, ok,
			float64(r.peakReserved)/(1<<20), r.hostBusyPct)
	}
	return r, nil
}

func answerRow(idx int, scenario string, a answer) []string {
	lat := ""
	if a.done > 0 {
		lat = strconv.FormatFloat(float64(a.done-a.sent)/float64(time.Millisecond), 'f', 1, 64)
	}
	return []string{
		strconv.Itoa(idx), scenario, a.who, strconv.FormatFloat(a.sent.Seconds(), 'f', 3, 64), lat,
		a.class.String(), strconv.Itoa(a.items), a.message,
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// timelineHeader is the header of timeline.csv: one row per interval and
// round. Counters (n_*, h_*, thr_*) are cumulative from the round's start;
// an empty cell is a missing value (scrape older than a second, metric
// absent): a gap, never 0.
var timelineHeader = []string{
	"round", "scenario", "t_s", "phase",
	// the gateway and its cgroup
	"alive", "restarts", "oom_kills", "ws_bytes", "limit_bytes", "ws_pct", "cpu_pct",
	// the gateway's own metrics
	"state_traces", "inflight_reserved", "inflight_limit", "held_requests",
	"thr_denied_shed", "thr_denied_open", "thr_denied_budget",
	// the normal clients, by class, and the items they got accepted
	"n_ok", "n_budget", "n_shed", "n_open", "n_refused", "n_error", "n_items",
	// the hostile peer: requests ended by class, and unanswered now
	"h_ok", "h_refused", "h_error", "h_held", "h_open",
	// the whole machine, in % of all its cores
	"host_busy_pct",
}

// sampler writes a round's timeline and keeps its peaks.
type sampler struct {
	idx      int
	scenario string
	t0       time.Time
	cpus     float64
	g        *gateway
	nc       *normalClients
	pr       *peer
	w        *harness.CSVFile
	phase    atomic.Value
	stop     func() // ends the sampling; set by start

	// Written by the sampler's goroutine, read after stop.
	peakWS, limit, oomKills uint64
	// peakReserved is the largest reservation of the load phase;
	// busySum and busyN add up the machine's busy share over it.
	peakReserved int64
	busySum      float64
	busyN        int
	prevHost     harness.HostCPU
}

func newSampler(idx int, scenario string, t0 time.Time, cpus float64, g *gateway, nc *normalClients, pr *peer, w *harness.CSVFile) *sampler {
	s := &sampler{idx: idx, scenario: scenario, t0: t0, cpus: cpus, g: g, nc: nc, pr: pr, w: w}
	s.phase.Store("warmup")
	return s
}

// hostBusy is the machine's mean busy share over the load phase, in %; -1
// when unknown. Read after stop.
func (s *sampler) hostBusy() float64 {
	if s.busyN == 0 {
		return -1
	}
	return s.busySum / float64(s.busyN)
}

func (s *sampler) setPhase(p string) { s.phase.Store(p) }

func (s *sampler) start(every time.Duration) {
	s.stop = harness.Background(func(ctx context.Context) {
		var prevCPU time.Duration
		var prevAt time.Time
		harness.Every(ctx, every, func() { prevCPU, prevAt = s.sample(prevCPU, prevAt) })
	})
}

func f64(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }

func (s *sampler) sample(prevCPU time.Duration, prevAt time.Time) (time.Duration, time.Time) {
	now := time.Now()
	_, alive, restarts := s.g.col.Proc.State()
	row := []string{
		strconv.Itoa(s.idx), s.scenario, f64(now.Sub(s.t0).Seconds(), 3), s.phase.Load().(string),
		strconv.FormatBool(alive), strconv.Itoa(restarts),
	}
	st, err := s.g.cg.Stats()
	if err == nil {
		s.peakWS, s.limit, s.oomKills = max(s.peakWS, st.WorkingSet), st.Limit, st.OOMKills
		wsPct, cpuPct := "", ""
		if st.Limit > 0 {
			wsPct = f64(100*float64(st.WorkingSet)/float64(st.Limit), 2)
		}
		if !prevAt.IsZero() {
			cpuPct = f64(100*(st.CPUUsage-prevCPU).Seconds()/(now.Sub(prevAt).Seconds()*s.cpus), 1)
		}
		row = append(row, strconv.FormatUint(st.OOMKills, 10), strconv.FormatUint(st.WorkingSet, 10), strconv.FormatUint(st.Limit, 10), wsPct, cpuPct)
		prevCPU, prevAt = st.CPUUsage, now
	} else {
		row = append(row, "", "", "", "", "")
	}
	load := s.phase.Load().(string) == "load"
	samples, at := s.g.col.Scraper.Get()
	fresh := alive && !at.IsZero() && now.Sub(at) < time.Second
	if v, ok := harness.Sum(samples, "otelcol_throttle_inflight_bytes", map[string]string{"budget": "reserved"}); ok && fresh && load {
		s.peakReserved = max(s.peakReserved, int64(v))
	}
	metric := func(name string, labels map[string]string) string {
		if !fresh {
			return ""
		}
		v, ok := harness.Sum(samples, name, labels)
		if !ok {
			return ""
		}
		return f64(v, 0)
	}
	row = append(row,
		metric("otelcol_throttle_state", map[string]string{"signal": "traces"}),
		metric("otelcol_throttle_inflight_bytes", map[string]string{"budget": "reserved"}),
		metric("otelcol_throttle_inflight_bytes", map[string]string{"budget": "limit"}),
		metric("otelcol_throttle_held_requests", nil),
		metric("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "shed"}),
		metric("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "open"}),
		metric("otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "budget"}),
	)
	for _, c := range []class{classOK, classBudget, classShed, classOpen, classRefused, classError} {
		row = append(row, strconv.FormatInt(s.nc.counts[c].Load(), 10))
	}
	row = append(row, strconv.FormatInt(s.nc.accepted.Load(), 10))
	hRefused := s.pr.counts[classBudget].Load() + s.pr.counts[classShed].Load() + s.pr.counts[classOpen].Load() + s.pr.counts[classRefused].Load()
	row = append(row,
		strconv.FormatInt(s.pr.counts[classOK].Load(), 10), strconv.FormatInt(hRefused, 10),
		strconv.FormatInt(s.pr.counts[classError].Load(), 10), strconv.FormatInt(s.pr.counts[classHeld].Load(), 10),
		strconv.FormatInt(s.pr.open.Load(), 10))
	busy := ""
	if h, err := harness.ReadHostCPU("/proc/stat"); err == nil {
		if pct := h.BusyPct(s.prevHost); s.prevHost.Total > 0 && pct >= 0 {
			busy = f64(pct, 1)
			if load {
				s.busySum += pct
				s.busyN++
			}
		}
		s.prevHost = h
	}
	row = append(row, busy)
	s.w.Write(row)
	return prevCPU, prevAt
}
