// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/series"
)

// delivery is a scenario's accounting of its spans, alike in the fleet's
// and the tier's summaries: what the load generators got accepted by the
// agents (and skipped, and failed), what the agents accepted, sent
// (acknowledged by the gateway), failed to send for good, failed to
// enqueue (queue full) and still held at the end; what the sink received;
// how long the drain took; the machine's load averages.
type delivery struct {
	LoadgenAccepted, AgentAccepted, AgentSent, AgentSendFailed, AgentEnqueueFailed, AgentQueued int64
	SinkSpans                                                                                   int64
	// DeliveredPct is SinkSpans over AgentAccepted.
	DeliveredPct float64
	// Lost is what the gateway (the tier's replicas) acknowledged and
	// never delivered (AgentSent - SinkSpans, when positive); Duplicates
	// the reverse (spans delivered twice after a timed-out
	// acknowledgement).
	Lost, Duplicates int64
	// DrainSeconds is the time from the end of the burst until the agents
	// had drained; negative when they did not within -drain-max.
	DrainSeconds                  float64
	LoadgenSkipped, LoadgenFailed int64
	LoadAvgStart, LoadAvgEnd      string
}

// countBurst counts the load generators' reports, the drain and the load
// averages of b.
func (d *delivery) countBurst(b *burst) {
	d.DrainSeconds = -1
	if b.drained >= 0 {
		d.DrainSeconds = b.drained.Seconds()
	}
	for _, r := range b.reps {
		if r == nil {
			continue
		}
		for _, p := range r.Phases {
			d.LoadgenAccepted += p.Total.AcceptedItems
			d.LoadgenSkipped += p.Total.Skipped
			d.LoadgenFailed += p.Total.Done() - p.Total.OK
		}
	}
	d.LoadAvgStart, d.LoadAvgEnd = b.loadAvgStart, b.loadAvgEnd
}

// countFlow counts the agents' and the sink's spans at the end (last).
func (d *delivery) countFlow(last flow) {
	d.AgentAccepted, d.AgentSent = int64(last.agAccepted), int64(last.agSent)
	d.AgentSendFailed, d.AgentEnqueueFailed, d.AgentQueued = int64(last.agSendFailed), int64(last.agEnqueueFailed), int64(last.agQueue)
	d.SinkSpans = int64(last.sinkSpans)
	if d.AgentAccepted > 0 {
		d.DeliveredPct = 100 * float64(d.SinkSpans) / float64(d.AgentAccepted)
	}
	d.Lost = max(0, d.AgentSent-d.SinkSpans)
	d.Duplicates = max(0, d.SinkSpans-d.AgentSent)
}

// states is the time a throttle spent in its states over a timeline, each
// interval counted in the state at its end, and the highest state seen
// (NaN: none, no throttle).
type states struct {
	max, openSeconds, sheddingSeconds float64
}

func newStates() states { return states{max: math.NaN()} }

// sinceLast is the time from point i-1 to point i of pts (0 for the first).
func sinceLast[P interface{ at() time.Duration }](pts []P, i int) time.Duration {
	if i == 0 {
		return 0
	}
	return pts[i].at() - pts[i-1].at()
}

// add counts a point in state (NaN: unknown) dt after the previous one.
func (s *states) add(state float64, dt time.Duration) {
	if math.IsNaN(state) {
		return
	}
	if math.IsNaN(s.max) || state > s.max {
		s.max = state
	}
	switch state {
	case 2:
		s.openSeconds += dt.Seconds()
	case 1:
		s.sheddingSeconds += dt.Seconds()
	}
}

// summary is one scenario's row of summary.csv.
type summary struct {
	delivery
	Scenario, Gateway, Protocol string
	GOMEMLIMIT                  bool
	Capacity, Offered           float64 // spans/s
	BurstSeconds                float64
	// BurstSinkRate is the sink's rate during the burst, spans/s, and its
	// share of the capacity; BurstPctReference its share of the reference
	// scenario's (0 without one in the run; see setReference).
	BurstSinkRate, BurstPctCapacity, BurstPctReference float64
	// BacklogSinkRate is the sink's rate after the burst while the agents
	// still hold a backlog (see backlogRate), spans/s, its share of the
	// capacity, and how long that lasted (0: no such stretch). The gateway
	// is as saturated as in the burst, but the generator and the agents'
	// intake no longer share the machine with it.
	BacklogSinkRate, BacklogPctCapacity, BacklogSeconds float64
	OOMKills                                            uint64
	Restarts                                            int
	PeakWSPct, MeanCPUPct                               float64
	// MeanHostCPUPct is how busy the whole machine was during the burst
	// (all cores; -1 unknown): near 100, the agents and the generator
	// starved the gateway of messages, whatever its quota.
	MeanHostCPUPct               float64
	CPUSeconds                   float64
	MaxState                     float64
	OpenSeconds, SheddingSeconds float64
	// GwRefusedSpans is what the gateway's receiver refused after decoding
	// it, GwEnqueueFailedSpans what its exporter's full queue refused (both
	// spans), GwDeniedRequests the requests the throttle refused before
	// reading them; over the whole scenario.
	GwRefusedSpans, GwEnqueueFailedSpans, GwDeniedRequests float64
	// BackendHungSeconds is how long the sink was stopped (-backend-hang).
	BackendHungSeconds float64
	// AcceptedP99 is the p99 of the gateway's answers to the requests it
	// accepted, over the scenario, in seconds: the upper bound of its
	// server duration histogram's bucket (NaN: unknown).
	AcceptedP99 float64

	points []point
}

func (s *summary) drainNote() string { return drainNote(s.DrainSeconds) }

// drainNote says whether and when a scenario drained (secs < 0: not).
func drainNote(secs float64) string {
	if secs < 0 {
		return "no (not within -drain-max)"
	}
	return fmt.Sprintf("in %.0f s", secs)
}

func summarize(o options, s scenario, f *fleet, b *burst) *summary {
	sum := &summary{
		Scenario: s.name, Gateway: s.kind, Protocol: o.protocol, GOMEMLIMIT: s.gomemlimit,
		Capacity: o.capacity, Offered: o.factor * o.capacity, BurstSeconds: o.burst.Seconds(),
		AcceptedP99: math.NaN(),
	}
	if f.gateway != nil {
		if gs, at := f.gateway.scr.Get(); !at.IsZero() {
			sum.AcceptedP99 = acceptedP99(gs, o.protocol)
		}
	}
	sum.countBurst(b)
	pts := f.rec.snapshot()
	sum.points = pts
	if len(pts) == 0 {
		return sum
	}
	last := pts[len(pts)-1]
	sum.countFlow(last.flow)
	sum.Restarts = last.restarts
	first := pts[0]
	if first.cgOK && last.cgOK {
		sum.OOMKills = last.cg.OOMKills - first.cg.OOMKills
		sum.CPUSeconds = (last.cg.CPUUsage - first.cg.CPUUsage).Seconds()
	}
	// The burst: the load phase after the warmup, up to its end.
	burstEnd := b.end
	burstStart := burstEnd.Add(-o.burst)
	startSink, endSink := math.NaN(), math.NaN()
	var cpuSum, hostSum float64
	var n, nHost int
	st := newStates()
	for i, p := range pts {
		at := f.rec.start.Add(p.t)
		sum.PeakWSPct = max(sum.PeakWSPct, p.wsPct)
		st.add(p.state, sinceLast(pts, i))
		if at.Before(burstStart) {
			startSink = p.sinkSpans
			continue
		}
		if !at.After(burstEnd) {
			endSink = p.sinkSpans
			if p.cpuPct >= 0 {
				cpuSum += p.cpuPct
				n++
			}
			if p.hostPct >= 0 {
				hostSum += p.hostPct
				nHost++
			}
		}
	}
	sum.MaxState, sum.OpenSeconds, sum.SheddingSeconds = st.max, st.openSeconds, st.sheddingSeconds
	gw := func(v func(gatewayCounts) float64) float64 {
		vals := make([]float64, len(pts))
		for i, p := range pts {
			vals[i] = v(p.gw)
		}
		return increase(vals)
	}
	sum.GwRefusedSpans = gw(func(c gatewayCounts) float64 { return c.refused })
	sum.GwEnqueueFailedSpans = gw(func(c gatewayCounts) float64 { return c.enqueueFailed })
	sum.GwDeniedRequests = gw(func(c gatewayCounts) float64 { return c.denied })
	if n > 0 {
		sum.MeanCPUPct = cpuSum / float64(n)
	}
	sum.MeanHostCPUPct = -1
	if nHost > 0 {
		sum.MeanHostCPUPct = hostSum / float64(nHost)
	}
	if !math.IsNaN(startSink) && !math.IsNaN(endSink) && o.burst > 0 {
		sum.BurstSinkRate = (endSink - startSink) / o.burst.Seconds()
		if o.capacity > 0 {
			sum.BurstPctCapacity = 100 * sum.BurstSinkRate / o.capacity
		}
	}
	sum.BacklogSinkRate, sum.BacklogSeconds = backlogRate(pts, burstEnd.Sub(f.rec.start), float64(o.agents*agentSenders))
	if o.capacity > 0 {
		sum.BacklogPctCapacity = 100 * sum.BacklogSinkRate / o.capacity
	}
	return sum
}

// agentSenders is how many requests one agent's exporter sends at once
// (sending_queue's num_consumers, 10 by default; the agents keep it). With
// fewer queued than all agents' senders, the gateway is no longer kept
// saturated.
const agentSenders = 10

// minBacklogTime is the shortest stretch backlogRate measures over.
const minBacklogTime = 10 * time.Second

// backlogRate returns the sink's rate from burstEnd (time since the
// recording started) until the agents' queue falls below a quarter of what
// it was then, and that stretch's length; 0, 0 when the queue was under
// minBacklog or the stretch is shorter than minBacklogTime. Why: the burst's
// rate is measured while the generator and the agents take in twice the
// capacity on the same machine; this one, with the gateway as saturated, is
// not, and tells what the saturated gateway delivers.
func backlogRate(pts []point, burstEnd time.Duration, minBacklog float64) (rate, secs float64) {
	first := -1
	for i, p := range pts {
		if p.t >= burstEnd {
			first = i
			break
		}
	}
	if first < 0 || pts[first].agQueue < minBacklog {
		return 0, 0
	}
	last := first
	for i := first + 1; i < len(pts) && pts[i].agQueue >= pts[first].agQueue/4; i++ {
		last = i
	}
	d := pts[last].t - pts[first].t
	if d < minBacklogTime {
		return 0, 0
	}
	return (pts[last].sinkSpans - pts[first].sinkSpans) / d.Seconds(), d.Seconds()
}

var summaryHeader = []string{
	"scenario", "gateway", "gomemlimit", "protocol", "capacity_spans_s", "offered_spans_s", "burst_s",
	"loadgen_accepted", "agent_accepted", "agent_sent", "agent_send_failed", "agent_enqueue_failed", "agent_queued_end",
	"sink_spans", "delivered_pct", "gateway_lost", "duplicates", "burst_sink_spans_s", "burst_pct_capacity", "burst_pct_reference",
	"drain_s", "oom_kills", "restarts", "peak_ws_pct", "mean_cpu_pct", "mean_host_cpu_pct", "cpu_s", "max_state", "open_s", "shedding_s",
	"loadgen_skipped", "loadgen_failed", "loadavg_start", "loadavg_end",
	"backlog_sink_spans_s", "backlog_pct_capacity", "backlog_s",
	"gw_refused_spans", "gw_enqueue_failed_spans", "gw_denied_requests", "backend_hung_s", "gw_accepted_p99_s",
}

func (s *summary) row() []string {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	return []string{
		s.Scenario, s.Gateway, strconv.FormatBool(s.GOMEMLIMIT), s.Protocol, f64(s.Capacity, 0), f64(s.Offered, 0), f64(s.BurstSeconds, 0),
		i(s.LoadgenAccepted), i(s.AgentAccepted), i(s.AgentSent), i(s.AgentSendFailed), i(s.AgentEnqueueFailed), i(s.AgentQueued),
		i(s.SinkSpans), f64(s.DeliveredPct, 2), i(s.Lost), i(s.Duplicates), f64(s.BurstSinkRate, 0), f64(s.BurstPctCapacity, 1), f64(s.BurstPctReference, 1),
		f64(s.DrainSeconds, 1), strconv.FormatUint(s.OOMKills, 10), strconv.Itoa(s.Restarts), f64(s.PeakWSPct, 1), f64(s.MeanCPUPct, 1),
		f64(s.MeanHostCPUPct, 1), f64(s.CPUSeconds, 1), opt(s.MaxState, 0), f64(s.OpenSeconds, 1), f64(s.SheddingSeconds, 1),
		i(s.LoadgenSkipped), i(s.LoadgenFailed), s.LoadAvgStart, s.LoadAvgEnd,
		f64(s.BacklogSinkRate, 0), f64(s.BacklogPctCapacity, 1), f64(s.BacklogSeconds, 0),
		f64(s.GwRefusedSpans, 0), f64(s.GwEnqueueFailedSpans, 0), f64(s.GwDeniedRequests, 0), f64(s.BackendHungSeconds, 1), opt(s.AcceptedP99, 3),
	}
}

// setReference sets every summary's BurstPctReference from the reference
// scenario's burst rate, if the run has one.
func setReference(sums []*summary) {
	ref := 0.0
	for _, s := range sums {
		if s.Scenario == referenceScenario.name {
			ref = s.BurstSinkRate
		}
	}
	for _, s := range sums {
		s.BurstPctReference = 0
		if ref > 0 {
			s.BurstPctReference = 100 * s.BurstSinkRate / ref
		}
	}
}

// writeSummaries rewrites summary.csv and summary.md after every scenario,
// so that an interrupted run keeps what it measured.
func writeSummaries(dir string, sums []*summary) error {
	setReference(sums)
	rows := make([][]string, len(sums))
	for i, s := range sums {
		rows[i] = s.row()
	}
	return harness.WriteSummaries(dir, summaryHeader, rows, func(w io.Writer) { printSummaries(w, sums) })
}

func printSummaries(w io.Writer, sums []*summary) {
	setReference(sums)
	fmt.Fprintln(w, "| gateway | delivered (sink / accepted by agents) | acknowledged by the gateway, never delivered | agents: enqueue / send failures (spans) | burst: spans/s to the sink (% of capacity) | burst: % of the reference | after the burst, agents backlogged: spans/s to the sink (% of capacity) | drained after | OOM kills | restarts | peak working set | CPU mean (burst) | machine's CPU busy (burst) | time in Open / Shedding |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range sums {
		open := "n/a"
		if !math.IsNaN(s.MaxState) {
			open = fmt.Sprintf("%.0f s / %.0f s", s.OpenSeconds, s.SheddingSeconds)
		}
		drain := "not drained"
		if s.DrainSeconds >= 0 {
			drain = fmt.Sprintf("%.0f s", s.DrainSeconds)
		}
		ref := "n/a"
		if s.BurstPctReference > 0 {
			ref = fmt.Sprintf("%.0f%%", s.BurstPctReference)
		}
		host := "n/a"
		if s.MeanHostCPUPct >= 0 {
			host = fmt.Sprintf("%.0f%%", s.MeanHostCPUPct)
		}
		backlog := "n/a"
		if s.BacklogSeconds > 0 {
			backlog = fmt.Sprintf("%.0f (%.0f%%) over %.0f s", s.BacklogSinkRate, s.BacklogPctCapacity, s.BacklogSeconds)
		}
		fmt.Fprintf(w, "| %s | %.1f%% (%d of %d) | %d | %d / %d | %.0f (%.0f%%) | %s | %s | %s | %d | %d | %.1f%% | %.0f%% | %s | %s |\n",
			s.Scenario, s.DeliveredPct, s.SinkSpans, s.AgentAccepted, s.Lost, s.AgentEnqueueFailed, s.AgentSendFailed,
			s.BurstSinkRate, s.BurstPctCapacity, ref, backlog, drain, s.OOMKills, s.Restarts, s.PeakWSPct, s.MeanCPUPct, host, open)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "At the gateway, over the whole scenario: what it refused after decoding and what before reading, and the CPU it spent.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| gateway | spans refused by the receiver after decoding | spans its exporter's full queue refused (enqueue_failed) | requests the throttle refused before reading them | CPU seconds | p99 of the answers to accepted requests | backend hung |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, s := range sums {
		denied, hung := "n/a", "no"
		if s.Gateway == colconfig.KindThrottle {
			denied = fmt.Sprintf("%.0f", s.GwDeniedRequests)
		}
		if s.BackendHungSeconds > 0 {
			hung = fmt.Sprintf("%.0f s", s.BackendHungSeconds)
		}
		p99 := "n/a"
		if !math.IsNaN(s.AcceptedP99) {
			p99 = fmt.Sprintf("≤ %g s", s.AcceptedP99)
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %s | %.1f | %s | %s |\n", s.Scenario, s.GwRefusedSpans, s.GwEnqueueFailedSpans, denied, s.CPUSeconds, p99, hung)
	}
}

// acceptedP99 is the p99 of a gateway's answers to the requests it
// accepted, from its server's duration histogram (the otlp receiver's
// gRPC or HTTP server, by protocol), as a bucket's upper bound in seconds.
// It counts since the gateway's last start.
func acceptedP99(samples []harness.Sample, protocol string) float64 {
	if protocol == "grpc" {
		return series.Quantile(samples, "rpc_server_call_duration", map[string]string{"rpc_response_status_code": "OK"}, 0.99)
	}
	return series.Quantile(samples, "http_server_request_duration", map[string]string{"http_response_status_code": "200"}, 0.99)
}
