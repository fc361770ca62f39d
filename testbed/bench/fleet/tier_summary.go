// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// tierSummary is one scenario's row of the tier's summary.csv, and its
// replicas' rows of summary-replicas.csv.
type tierSummary struct {
	// delivery: as in the fleet's summary; Lost is what the replicas
	// acknowledged and never delivered.
	delivery
	Scenario, Gateway, Protocol string
	Round                       int
	Factor                      float64
	// Capacity is the summed capacity, Offered the burst's rate, spans/s.
	Capacity, Offered float64
	BurstSeconds      float64
	// BurstSinkRate is the sink's rate during the burst (between the
	// points closest to its start and end), spans/s, and its share of the
	// summed capacity.
	BurstSinkRate, BurstPctCapacity float64
	OOMKills                        uint64
	Restarts                        int
	// MeanHostCPUPct is how busy the machine was during the burst (-1:
	// unknown).
	MeanHostCPUPct float64
	// WeakReplica is the replica with the least CPU; WeakShare its share
	// of the spans the replicas accepted during the burst, WeakCapShare its
	// share of the summed capacity, both %.
	WeakReplica             string
	WeakShare, WeakCapShare float64

	Reps []replicaSummary
}

// replicaSummary is one replica of a scenario. The counts are over the
// burst; the times in Shedding and Open over the whole scenario.
type replicaSummary struct {
	Name                     string
	CPUs, Capacity, CapShare float64
	// Accepted is the spans its receiver accepted (the work it admitted),
	// Share their share of the tier's, %; RefusedSpans the spans its
	// receiver refused.
	Accepted, Share, RefusedSpans float64
	// The throttle's decisions, in requests (NaN without a throttle), and
	// SentShare the replica's share of all the requests the replicas
	// decided, %: of the requests the agents sent the tier.
	Allowed, DeniedShed, DeniedOpen, DeniedBudget float64
	SentShare                                     float64
	// HeldMean and HeldPeak are the requests it held (NaN without a
	// throttle).
	HeldMean, HeldPeak           float64
	SheddingSeconds, OpenSeconds float64
	// MaxState is the highest state seen (NaN without a throttle).
	MaxState              float64
	OOMKills              uint64
	Restarts              int
	MeanCPUPct, PeakWSPct float64
	// ConnsOpened is the connections the balancer gave it, ConnsMean the
	// mean of those open (NaN: unknown).
	ConnsOpened, ConnsMean float64
}

// increase is how much a cumulative counter grew over vals, in order:
// missing values (NaN) are skipped, and a fall is a restart from 0 (the
// process restarted, its counters with it).
func increase(vals []float64) float64 {
	var total float64
	last := math.NaN()
	for _, v := range vals {
		if math.IsNaN(v) {
			continue
		}
		switch {
		case math.IsNaN(last):
		case v >= last:
			total += v - last
		default:
			total += v
		}
		last = v
	}
	return total
}

// burstWindow returns the indexes of pts from the last point at or before
// the burst's start to the last one at or before its end: the points a
// counter's increase over the burst is read from.
func burstWindow(pts []tierPoint, recStart, burstStart, burstEnd time.Time) (from, to int) {
	from, to = -1, -1
	for i, p := range pts {
		at := recStart.Add(p.t)
		if !at.After(burstStart) {
			from = i
		}
		if !at.After(burstEnd) {
			to = i
		}
	}
	return max(from, 0), to
}

func summarizeTier(o options, t *tier, b *burst) *tierSummary {
	capacity := 0.0
	for _, r := range t.replicas {
		capacity += r.capacity
	}
	s := &tierSummary{
		Scenario: t.scenario.name, Gateway: t.scenario.kind, Protocol: o.protocol, Round: t.round, Factor: t.factor,
		Capacity: capacity, Offered: t.factor * capacity, BurstSeconds: o.burst.Seconds(), MeanHostCPUPct: -1,
	}
	s.countBurst(b)
	pts := t.rec.snapshot()
	if len(pts) == 0 {
		return s
	}
	s.countFlow(pts[len(pts)-1].flow)

	burstEnd := b.end
	burstStart := burstEnd.Add(-o.burst)
	from, to := burstWindow(pts, t.rec.start, burstStart, burstEnd)
	if to > from {
		s.BurstSinkRate = (pts[to].sinkSpans - pts[from].sinkSpans) / (pts[to].t - pts[from].t).Seconds()
		if capacity > 0 {
			s.BurstPctCapacity = 100 * s.BurstSinkRate / capacity
		}
		var host float64
		n := 0
		for _, p := range pts[from+1 : to+1] {
			if p.hostPct >= 0 {
				host += p.hostPct
				n++
			}
		}
		if n > 0 {
			s.MeanHostCPUPct = host / float64(n)
		}
	}

	weak := 0
	for i, r := range t.replicas {
		if r.cpus < t.replicas[weak].cpus {
			weak = i
		}
	}
	var accepted, decided float64
	for i, r := range t.replicas {
		rs := summarizeReplica(pts, i, from, to)
		rs.Name, rs.CPUs, rs.Capacity = r.name, r.cpus, r.capacity
		if capacity > 0 {
			rs.CapShare = 100 * r.capacity / capacity
		}
		accepted += rs.Accepted
		decided += rs.decided()
		s.OOMKills += rs.OOMKills
		s.Restarts += rs.Restarts
		s.Reps = append(s.Reps, rs)
	}
	for i := range s.Reps {
		if accepted > 0 {
			s.Reps[i].Share = 100 * s.Reps[i].Accepted / accepted
		}
		s.Reps[i].SentShare = math.NaN()
		if decided > 0 {
			s.Reps[i].SentShare = 100 * s.Reps[i].decided() / decided
		}
	}
	s.WeakReplica, s.WeakShare, s.WeakCapShare = s.Reps[weak].Name, s.Reps[weak].Share, s.Reps[weak].CapShare
	return s
}

// decided is the requests the replica's throttle decided (NaN without
// one).
func (r replicaSummary) decided() float64 {
	return r.Allowed + r.DeniedShed + r.DeniedOpen + r.DeniedBudget
}

// summarizeReplica summarizes replica i of pts, its counters over the
// points from..to (the burst). Share is left for the caller.
func summarizeReplica(pts []tierPoint, i, from, to int) replicaSummary {
	var rs replicaSummary
	series := func(v func(replicaPoint) float64) []float64 {
		var out []float64
		if to <= from {
			return out
		}
		for _, p := range pts[from : to+1] {
			out = append(out, v(p.reps[i]))
		}
		return out
	}
	rs.Accepted = increase(series(func(r replicaPoint) float64 { return r.accepted }))
	rs.RefusedSpans = increase(series(func(r replicaPoint) float64 { return r.refused }))
	throttled := false
	for _, p := range pts {
		throttled = throttled || !math.IsNaN(p.reps[i].state)
	}
	rs.Allowed, rs.DeniedShed, rs.DeniedOpen, rs.DeniedBudget = math.NaN(), math.NaN(), math.NaN(), math.NaN()
	rs.HeldMean, rs.HeldPeak = math.NaN(), math.NaN()
	if throttled {
		rs.Allowed = increase(series(func(r replicaPoint) float64 { return r.allowed }))
		rs.DeniedShed = increase(series(func(r replicaPoint) float64 { return r.deniedShed }))
		rs.DeniedOpen = increase(series(func(r replicaPoint) float64 { return r.deniedOpen }))
		rs.DeniedBudget = increase(series(func(r replicaPoint) float64 { return r.deniedBudget }))
		var held float64
		n := 0
		rs.HeldPeak = 0
		for _, v := range series(func(r replicaPoint) float64 { return r.held }) {
			if !math.IsNaN(v) {
				held += v
				n++
				rs.HeldPeak = max(rs.HeldPeak, v)
			}
		}
		if n > 0 {
			rs.HeldMean = held / float64(n)
		}
	}
	rs.ConnsOpened = increase(series(func(r replicaPoint) float64 { return lbValue(r, r.lb.ConnsTotal) }))
	rs.ConnsMean = mean(series(func(r replicaPoint) float64 { return lbValue(r, r.lb.Conns) }))
	var cpu float64
	n := 0
	if to > from {
		for _, p := range pts[from+1 : to+1] {
			if c := p.reps[i].cpuPct; c >= 0 {
				cpu += c
				n++
			}
		}
	}
	if n > 0 {
		rs.MeanCPUPct = cpu / float64(n)
	}
	var firstCg, lastCg *harness.CgStats
	st := newStates()
	for j, p := range pts {
		r := p.reps[i]
		rs.PeakWSPct = max(rs.PeakWSPct, r.wsPct)
		if r.cgOK {
			if firstCg == nil {
				firstCg = &pts[j].reps[i].cg
			}
			lastCg = &pts[j].reps[i].cg
		}
		rs.Restarts = r.restarts
		st.add(r.state, sinceLast(pts, j))
	}
	rs.MaxState, rs.OpenSeconds, rs.SheddingSeconds = st.max, st.openSeconds, st.sheddingSeconds
	if firstCg != nil {
		rs.OOMKills = lastCg.OOMKills - firstCg.OOMKills
	}
	return rs
}

// mean is the mean of the values of l that are not NaN (NaN: none).
func mean(l []float64) float64 {
	var total float64
	n := 0
	for _, v := range l {
		if !math.IsNaN(v) {
			total += v
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return total / float64(n)
}

// lbValue is v when the balancer's statistics of r were read, else NaN.
func lbValue(r replicaPoint, v float64) float64 {
	if !r.lbOK {
		return math.NaN()
	}
	return v
}

var tierSummaryHeader = []string{
	"scenario", "gateway", "protocol", "round", "factor", "capacity_spans_s", "offered_spans_s", "burst_s",
	"loadgen_accepted", "agent_accepted", "agent_sent", "agent_send_failed", "agent_enqueue_failed", "agent_queued_end",
	"sink_spans", "delivered_pct", "lost", "duplicates", "burst_sink_spans_s", "burst_pct_capacity",
	"drain_s", "oom_kills", "restarts", "mean_host_cpu_pct", "weak_replica", "weak_share_pct", "weak_capacity_share_pct",
	"loadgen_skipped", "loadgen_failed", "loadavg_start", "loadavg_end",
}

func (s *tierSummary) row() []string {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	return []string{
		s.Scenario, s.Gateway, s.Protocol, strconv.Itoa(s.Round), f64(s.Factor, 2), f64(s.Capacity, 0), f64(s.Offered, 0), f64(s.BurstSeconds, 0),
		i(s.LoadgenAccepted), i(s.AgentAccepted), i(s.AgentSent), i(s.AgentSendFailed), i(s.AgentEnqueueFailed), i(s.AgentQueued),
		i(s.SinkSpans), f64(s.DeliveredPct, 2), i(s.Lost), i(s.Duplicates), f64(s.BurstSinkRate, 0), f64(s.BurstPctCapacity, 1),
		f64(s.DrainSeconds, 1), strconv.FormatUint(s.OOMKills, 10), strconv.Itoa(s.Restarts), f64(s.MeanHostCPUPct, 1),
		s.WeakReplica, f64(s.WeakShare, 1), f64(s.WeakCapShare, 1),
		i(s.LoadgenSkipped), i(s.LoadgenFailed), s.LoadAvgStart, s.LoadAvgEnd,
	}
}

var replicaSummaryHeader = []string{
	"scenario", "round", "factor", "replica", "cpus", "capacity_spans_s", "capacity_share_pct",
	"accepted_spans", "share_pct", "refused_spans", "sent_share_pct", "req_allowed", "req_denied_shed", "req_denied_open", "req_denied_budget",
	"held_mean", "held_peak", "shedding_s", "open_s", "max_state", "oom_kills", "restarts", "mean_cpu_pct", "peak_ws_pct",
	"lb_conns_opened", "lb_conns_mean",
}

func (r replicaSummary) row(s *tierSummary) []string {
	return []string{
		s.Scenario, strconv.Itoa(s.Round), f64(s.Factor, 2), r.Name, f64(r.CPUs, 3), f64(r.Capacity, 0), f64(r.CapShare, 1),
		f64(r.Accepted, 0), f64(r.Share, 1), f64(r.RefusedSpans, 0), opt(r.SentShare, 1), opt(r.Allowed, 0), opt(r.DeniedShed, 0), opt(r.DeniedOpen, 0), opt(r.DeniedBudget, 0),
		opt(r.HeldMean, 1), opt(r.HeldPeak, 0), f64(r.SheddingSeconds, 0), f64(r.OpenSeconds, 0), opt(r.MaxState, 0),
		strconv.FormatUint(r.OOMKills, 10), strconv.Itoa(r.Restarts), f64(r.MeanCPUPct, 1), f64(r.PeakWSPct, 1),
		f64(r.ConnsOpened, 0), opt(r.ConnsMean, 1),
	}
}

// writeTierSummaries rewrites summary.csv, summary-replicas.csv and
// summary.md after every scenario, so that an interrupted run keeps what
// it measured.
func writeTierSummaries(o options, caps []float64, sums []*tierSummary) error {
	rows := make([][]string, len(sums))
	var repRows [][]string
	for i, s := range sums {
		rows[i] = s.row()
		for _, r := range s.Reps {
			repRows = append(repRows, r.row(s))
		}
	}
	if err := harness.WriteCSV(filepath.Join(o.out, "summary-replicas.csv"), replicaSummaryHeader, repRows); err != nil {
		return err
	}
	return harness.WriteSummaries(o.out, tierSummaryHeader, rows, func(w io.Writer) { printTierSummaries(w, o, caps, sums) })
}

// stockRate is the burst rate of the stock tier of the same round and
// factor as s (0 without one).
func stockRate(sums []*tierSummary, s *tierSummary) float64 {
	for _, x := range sums {
		if x.Round == s.Round && x.Factor == s.Factor && x.Scenario == colconfig.KindStock {
			return x.BurstSinkRate
		}
	}
	return 0
}

// printTierSummaries writes the tier's tables (summary.md): the setup, one
// row per scenario, one per replica, and the targets the tier must meet (tierChecks).
func printTierSummaries(w io.Writer, o options, caps []float64, sums []*tierSummary) {
	fmt.Fprintf(w, "Tier of %d replicas (%s CPU, %d MiB each) behind HAProxy (TCP, round-robin); %d stock agents over %s (compression: %s), %d-span requests of %d-byte attributes; burst %s at each factor times the summed capacity, %d round(s).\n\n",
		len(caps), joinFloats(o.tier.cpus, 2), o.memMiB, o.agents, o.protocol, compressionName(o.agentCompression), o.spans, o.attrSize, o.burst, o.tier.rounds)
	fmt.Fprintf(w, "Capacity of the replicas (spans/s): %s; summed %.0f.\n\n", joinFloats(caps, 0), sum(caps))

	fmt.Fprintln(w, "| round | factor | gateway | delivered (sink / accepted by agents) | acknowledged, never delivered | agents: enqueue / send failures (spans) | OOM kills (restarts) | burst: spans/s to the sink (% of summed capacity) | burst vs the stock tier | weakest replica: share of admitted / of capacity | drained | machine's CPU busy (burst) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range sums {
		vsStock := "n/a"
		if st := stockRate(sums, s); st > 0 && s.Scenario != colconfig.KindStock {
			vsStock = fmt.Sprintf("%.2f×", s.BurstSinkRate/st)
		}
		host := "n/a"
		if s.MeanHostCPUPct >= 0 {
			host = fmt.Sprintf("%.0f%%", s.MeanHostCPUPct)
		}
		drain := "not drained"
		if s.DrainSeconds >= 0 {
			drain = fmt.Sprintf("%.0f s", s.DrainSeconds)
		}
		fmt.Fprintf(w, "| %d | %g | %s | %.1f%% (%d of %d) | %d | %d / %d | %d (%d) | %.0f (%.0f%%) | %s | %s: %.0f%% / %.0f%% | %s | %s |\n",
			s.Round, s.Factor, s.Scenario, s.DeliveredPct, s.SinkSpans, s.AgentAccepted, s.Lost, s.AgentEnqueueFailed, s.AgentSendFailed, s.OOMKills, s.Restarts,
			s.BurstSinkRate, s.BurstPctCapacity, vsStock, s.WeakReplica, s.WeakShare, s.WeakCapShare, drain, host)
	}

	fmt.Fprintln(w, "\nPer replica, during the burst (Shedding / Open: over the whole scenario):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| round | factor | gateway | replica (CPU) | admitted spans: share (capacity share) | requests sent to it: share | refused requests: shed / open / budget | refused spans | held requests: mean / peak | Shedding / Open | OOM kills | CPU (% of quota) | peak working set | connections from the balancer: opened / open (mean) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range sums {
		for _, r := range s.Reps {
			sent, refused, held, states := "n/a", "n/a", "n/a", "n/a"
			if !math.IsNaN(r.SentShare) {
				sent = fmt.Sprintf("%.0f%%", r.SentShare)
			}
			if !math.IsNaN(r.Allowed) {
				refused = fmt.Sprintf("%.0f / %.0f / %.0f", r.DeniedShed, r.DeniedOpen, r.DeniedBudget)
				held = fmt.Sprintf("%.1f / %.0f", r.HeldMean, r.HeldPeak)
				states = fmt.Sprintf("%.0f s / %.0f s", r.SheddingSeconds, r.OpenSeconds)
			}
			fmt.Fprintf(w, "| %d | %g | %s | %s (%g) | %.0f%% (%.0f%%) | %s | %s | %.0f | %s | %s | %d | %.0f%% | %.0f%% | %.0f / %.1f |\n",
				s.Round, s.Factor, s.Scenario, r.Name, r.CPUs, r.Share, r.CapShare, sent, refused, r.RefusedSpans, held, states,
				r.OOMKills, r.MeanCPUPct, r.PeakWSPct, r.ConnsOpened, r.ConnsMean)
		}
	}

	checks := tierChecks(sums)
	if len(checks) == 0 {
		return
	}
	fmt.Fprintln(w, "\nTargets, round by round:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| round | factor | gateway | target | measured | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, c := range checks {
		met := "no"
		if c.met {
			met = "yes"
		}
		fmt.Fprintf(w, "| %d | %g | %s | %s | %s | %s |\n", c.round, c.factor, c.scenario, c.target, c.measured, met)
	}
}

func compressionName(c string) string {
	if c == "" {
		return "the exporter's default, gzip"
	}
	return c
}

// tierCheck is one target of the tier in one round.
type tierCheck struct {
	round            int
	factor           float64
	scenario         string
	target, measured string
	met              bool
}

// tierChecks checks the tier's targets for every throttle scenario, round
// by round: at 1× the summed capacity, a burst throughput of at least 0.95×
// the stock tier's; above it, everything delivered, nothing acknowledged
// lost, no OOM kill, at least 90% of the summed capacity to the sink and
// not less than at 1×, and the weakest replica's share of the admitted
// work no more than its share of the capacity plus 10 points.
func tierChecks(sums []*tierSummary) []tierCheck {
	var out []tierCheck
	at1 := func(s *tierSummary) *tierSummary {
		for _, x := range sums {
			if x.Round == s.Round && x.Factor == 1 && x.Scenario == s.Scenario {
				return x
			}
		}
		return nil
	}
	for _, s := range sums {
		if s.Gateway != colconfig.KindThrottle {
			continue
		}
		add := func(target, measured string, met bool) {
			out = append(out, tierCheck{round: s.Round, factor: s.Factor, scenario: s.Scenario, target: target, measured: measured, met: met})
		}
		if s.Factor == 1 {
			if st := stockRate(sums, s); st > 0 {
				r := s.BurstSinkRate / st
				add("burst throughput ≥ 0.95× the stock tier's", fmt.Sprintf("%.2f×", r), r >= 0.95)
			}
			continue
		}
		if s.Factor < 1 {
			continue
		}
		add("delivers 100%", fmt.Sprintf("%.2f%%", s.DeliveredPct), s.AgentAccepted > 0 && s.SinkSpans >= s.AgentAccepted)
		add("nothing acknowledged lost", strconv.FormatInt(s.Lost, 10), s.Lost == 0)
		add("no OOM kill", strconv.FormatUint(s.OOMKills, 10), s.OOMKills == 0)
		add("burst ≥ 90% of the summed capacity", fmt.Sprintf("%.0f%%", s.BurstPctCapacity), s.BurstPctCapacity >= 90)
		if one := at1(s); one != nil {
			add("burst not less than at 1×", fmt.Sprintf("%.0f vs %.0f spans/s", s.BurstSinkRate, one.BurstSinkRate), s.BurstSinkRate >= one.BurstSinkRate)
		}
		add("weakest replica's share ≤ its capacity share + 10 points", fmt.Sprintf("%s: %.1f%% vs %.1f%% + 10", s.WeakReplica, s.WeakShare, s.WeakCapShare), s.WeakShare <= s.WeakCapShare+10)
	}
	return out
}
