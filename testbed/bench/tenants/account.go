// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// num is a figure that may be missing (NaN), written to JSON as null.
type num float64

func (n num) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(n)) || math.IsInf(float64(n), 0) {
		return []byte("null"), nil
	}
	return json.Marshal(float64(n))
}

func (n *num) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = num(math.NaN())
		return nil
	}
	var f float64
	err := json.Unmarshal(b, &f)
	*n = num(f)
	return err
}

// tenantResult is one tenant's figures of one round, in spans unless
// named otherwise.
type tenantResult struct {
	Tenant string `json:"tenant"`
	Noisy  bool   `json:"noisy"`
	// Rate is the spans/s its load generator offered its agent.
	Rate num `json:"rate"`
	// Offered is what the load generator sent the agent, GenRefused what
	// the agent refused of it (its queue full).
	Offered    int64 `json:"offered"`
	GenRefused int64 `json:"gen_refused"`
	// The agent's own counters at the end of the round: accepted from the
	// generator, sent (the gateway answered 2xx), given up on after its
	// retries, dropped because its queue was full, and its queue's size
	// (batches).
	AgentAccepted      num `json:"agent_accepted"`
	AgentSent          num `json:"agent_sent"`
	AgentSendFailed    num `json:"agent_send_failed"`
	AgentEnqueueFailed num `json:"agent_enqueue_failed"`
	AgentQueue         num `json:"agent_queue"`
	// Delivered is what the sink counted of the tenant; WindowRate its
	// spans/s over the load window.
	Delivered  int64 `json:"delivered"`
	WindowRate num   `json:"window_rate"`
	// Exports and Spans count the agent's exports (every attempt, retries
	// included) by class of the answer, as its tap saw them.
	Exports [numClasses]int64 `json:"exports"`
	Spans   [numClasses]int64 `json:"spans"`
	// SettledSpans counts the spans of the exports from settleAfter into
	// the load window on, by class.
	SettledSpans [numClasses]int64 `json:"settled_spans"`
	// P50Ms and P99Ms are the latencies of its accepted exports in the load
	// window (the tap's timing: from the export's arrival at the tap to the
	// answer's end), and OKInWindow how many there were.
	P50Ms      num `json:"p50_ms"`
	P99Ms      num `json:"p99_ms"`
	OKInWindow int `json:"ok_in_window"`
}

// Backlog is what the agent accepted and has neither sent nor given up on
// yet: in its batch processor, its queue, or in flight.
func (t tenantResult) Backlog() float64 {
	return max(float64(t.AgentAccepted-t.AgentSent-t.AgentSendFailed-t.AgentEnqueueFailed), 0)
}

// Lost is what the agent accepted and is neither at the sink nor still in
// its backlog: acknowledged by the gateway and never delivered, given up
// on by the agent, or dropped from its full queue.
func (t tenantResult) Lost() float64 {
	return float64(t.AgentAccepted) - float64(t.Delivered) - t.Backlog()
}

// Acceptance is the share of the spans the agent sent (every attempt)
// that the gateway accepted; NaN when it sent none.
func (t tenantResult) Acceptance() float64 { return acceptance(t.Spans) }

// SettledAcceptance is Acceptance from settleAfter into the load window on.
func (t tenantResult) SettledAcceptance() float64 { return acceptance(t.SettledSpans) }

// acceptance is the share of spans accepted; NaN for none.
func acceptance(spans [numClasses]int64) float64 {
	all := sum(spans[:])
	if all == 0 {
		return math.NaN()
	}
	return float64(spans[classOK]) / float64(all)
}

// settleAfter is how far into the load window the settled figures start:
// a fresh gateway of 0.1 CPU spends its first seconds at its quota, and the
// budget refusals of that start fall in the baseline and noisy rounds
// alike.
const settleAfter = 10 * time.Second

// Refused is the agent's exports the gateway (or the proxy) answered with
// anything but 2xx, or not at all; Hinted those refused with a Retry-After.
func (t tenantResult) Refused() (refused, hinted int64) {
	for c, n := range t.Exports {
		if class(c).refused() {
			refused += n
		}
	}
	return refused, t.Exports[class429Retry] + t.Exports[class503Retry]
}

// roundResult is one round's figures: its tenants', and the gateway's and
// the machine's.
type roundResult struct {
	Name     string         `json:"name"`
	Topology string         `json:"topology"`
	Gateway  string         `json:"gateway"`
	Round    string         `json:"round"`
	Tenants  []tenantResult `json:"tenants"`
	// WindowSeconds is the load window's length.
	WindowSeconds num `json:"window_s"`
	// QuietP50Ms and QuietP99Ms pool the quiet tenants' accepted exports in
	// the load window (QuietOK of them).
	QuietP50Ms num `json:"quiet_p50_ms"`
	QuietP99Ms num `json:"quiet_p99_ms"`
	QuietOK    int `json:"quiet_ok"`
	// The gateway: OOM kills and restarts, peak working set and its limit,
	// its mean CPU (% of its quota) and the machine's (% of all its cores)
	// over the load window, the machine's busiest sample.
	OOMKills    uint64 `json:"oom_kills"`
	Restarts    int    `json:"restarts"`
	PeakWSBytes num    `json:"peak_ws_bytes"`
	LimitBytes  num    `json:"limit_bytes"`
	CPUMeanPct  num    `json:"cpu_mean_pct"`
	HostMeanPct num    `json:"host_busy_mean_pct"`
	HostMaxPct  num    `json:"host_busy_max_pct"`
	// The throttle (NaN without): seconds Shedding and Open in the load
	// window, peak in-flight bytes reserved and the budget, and its
	// decisions over the round (HTTP requests; counted again from 0 after
	// a restart).
	ShedSeconds  num `json:"shed_s"`
	OpenSeconds  num `json:"open_s"`
	PeakReserved num `json:"peak_reserved"`
	Budget       num `json:"budget"`
	Allowed      num `json:"allowed"`
	DeniedShed   num `json:"denied_shed"`
	DeniedOpen   num `json:"denied_open"`
	DeniedBudget num `json:"denied_budget"`
	// CutOff counts the requests allowed at first and cut off later, by
	// reason (budget, open, slow, stopping): the client saw a refusal.
	CutOff map[string]num `json:"cut_off,omitempty"`
	// Drained: the quiet tenants' agents settled within -drain-max,
	// DrainSeconds after the load window.
	Drained      bool `json:"drained"`
	DrainSeconds num  `json:"drain_s"`
	// SinkOther counts spans of no known tenant at the sink, SinkBad the
	// exports it could not decode: both should be 0.
	SinkOther int64 `json:"sink_other"`
	SinkBad   int64 `json:"sink_bad"`
}

// quiet returns the round's quiet tenants.
func (r *roundResult) quiet() []tenantResult {
	var out []tenantResult
	for _, t := range r.Tenants {
		if !t.Noisy {
			out = append(out, t)
		}
	}
	return out
}

// noisy returns the round's noisy tenant, nil when it has none.
func (r *roundResult) noisy() *tenantResult {
	for i := range r.Tenants {
		if r.Tenants[i].Noisy {
			return &r.Tenants[i]
		}
	}
	return nil
}

// tenant returns the round's figures of the tenant name, nil when it did
// not send.
func (r *roundResult) tenant(name string) *tenantResult {
	for i := range r.Tenants {
		if r.Tenants[i].Tenant == name {
			return &r.Tenants[i]
		}
	}
	return nil
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of v,
// which it sorts; NaN for none.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	rank := int(math.Ceil(p / 100 * float64(len(v))))
	return v[min(max(rank, 1), len(v))-1]
}

// tapFigures fills a tenant's figures from its tap's exports: every
// export by class, and the latencies of those accepted in the window.
func tapFigures(t *tenantResult, exports []export, w loadWindow) (okLatencies []float64) {
	for _, e := range exports {
		t.Exports[e.class]++
		t.Spans[e.class] += e.spans
		if !e.at.Before(w.start.Add(settleAfter)) {
			t.SettledSpans[e.class] += e.spans
		}
		if e.class == classOK && w.contains(e.at) {
			okLatencies = append(okLatencies, float64(e.latency)/float64(time.Millisecond))
		}
	}
	t.OKInWindow = len(okLatencies)
	t.P50Ms = num(percentile(slices.Clone(okLatencies), 50))
	t.P99Ms = num(percentile(slices.Clone(okLatencies), 99))
	return okLatencies
}

// windowRate is the rate of a cumulative count over w, from the samples
// (at, count) within it; NaN without two of them.
func windowRate(at []time.Time, count []int64, w loadWindow) float64 {
	first, last := -1, -1
	for i, t := range at {
		if !w.contains(t) {
			continue
		}
		if first < 0 {
			first = i
		}
		last = i
	}
	if first < 0 || last == first {
		return math.NaN()
	}
	return float64(count[last]-count[first]) / at[last].Sub(at[first]).Seconds()
}

// gatewayFigures fills a round's gateway and machine figures from its
// points: OOM kills, peak working set and the means over the window.
func gatewayFigures(res *roundResult, pts []point, w loadWindow, interval time.Duration) {
	var cpu, host []float64
	res.PeakWSBytes, res.LimitBytes, res.HostMaxPct = num(math.NaN()), num(math.NaN()), num(math.NaN())
	res.ShedSeconds, res.OpenSeconds, res.PeakReserved, res.Budget = num(math.NaN()), num(math.NaN()), num(math.NaN()), num(math.NaN())
	for _, p := range pts {
		if p.cgOK {
			res.OOMKills = max(res.OOMKills, p.cg.OOMKills)
			res.PeakWSBytes = num(maxNaN(float64(res.PeakWSBytes), float64(p.cg.WorkingSet)))
			res.LimitBytes = num(float64(p.cg.Limit))
		}
		res.Restarts = max(res.Restarts, p.restart)
		res.PeakReserved = num(maxNaN(float64(res.PeakReserved), p.reserved))
		if !math.IsNaN(p.budget) {
			res.Budget = num(p.budget)
		}
		if !w.contains(p.at) {
			continue
		}
		if p.cpuPct >= 0 {
			cpu = append(cpu, p.cpuPct)
		}
		if p.hostPct >= 0 {
			host = append(host, p.hostPct)
			res.HostMaxPct = num(maxNaN(float64(res.HostMaxPct), p.hostPct))
		}
		if !math.IsNaN(p.state) {
			res.ShedSeconds = num(zero(float64(res.ShedSeconds)))
			res.OpenSeconds = num(zero(float64(res.OpenSeconds)))
			switch p.state {
			case 1:
				res.ShedSeconds += num(interval.Seconds())
			case 2:
				res.OpenSeconds += num(interval.Seconds())
			}
		}
	}
	res.CPUMeanPct, res.HostMeanPct = num(mean(cpu)), num(mean(host))
}

// maxNaN is the larger of a and b, a NaN counting as none.
func maxNaN(a, b float64) float64 {
	switch {
	case math.IsNaN(a):
		return b
	case math.IsNaN(b):
		return a
	}
	return max(a, b)
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// comparison is one gateway in one topology: the quiet tenants' figures
// with the noisy tenant against their own without it, in the same run.
type comparison struct {
	base, noisy *roundResult
}

// The targets the benchmark holds the tenant-keyed gateway to.
const (
	targetAcceptance = 0.99 // of the baseline's
	targetP99Rise    = 0.10
	// slack absorbs the rounding of the ratios: a figure at its bound
	// passes.
	slack = 1e-9
)

// quietAcceptance is, over the quiet tenants, the lowest ratio of a
// tenant's acceptance in the noisy round to its baseline's, and the same
// ratio pooled over them (spans); NaN when no tenant has both.
func (c comparison) quietAcceptance() (lowest, pooled float64) {
	return c.quietAcceptanceOf(func(t *tenantResult) [numClasses]int64 { return t.Spans })
}

// quietSettledAcceptance is quietAcceptance from settleAfter into the load
// window on.
func (c comparison) quietSettledAcceptance() (lowest, pooled float64) {
	return c.quietAcceptanceOf(func(t *tenantResult) [numClasses]int64 { return t.SettledSpans })
}

func (c comparison) quietAcceptanceOf(spans func(*tenantResult) [numClasses]int64) (lowest, pooled float64) {
	lowest = math.NaN()
	var base, noisy [numClasses]int64
	for _, n := range c.noisy.quiet() {
		b := c.base.tenant(n.Tenant)
		if b == nil {
			continue
		}
		sn, sb := spans(&n), spans(b)
		if r := acceptance(sn) / acceptance(sb); !math.IsNaN(r) {
			lowest = min(r, zeroNaN(lowest, r))
		}
		for i := range sn {
			noisy[i] += sn[i]
			base[i] += sb[i]
		}
	}
	return lowest, acceptance(noisy) / acceptance(base)
}

// quietThroughput is the quiet tenants' spans/s delivered in the noisy
// round's load window against the baseline's, pooled.
func (c comparison) quietThroughput() float64 {
	var b, n float64
	for _, t := range c.noisy.quiet() {
		if bt := c.base.tenant(t.Tenant); bt != nil {
			n += float64(t.WindowRate)
			b += float64(bt.WindowRate)
		}
	}
	return n / b
}

// quietLoss is what the quiet tenants lost, and still held, in the noisy
// round.
func (c comparison) quietLoss() (lost, backlog float64) {
	for _, t := range c.noisy.quiet() {
		lost += t.Lost()
		backlog += t.Backlog()
	}
	return lost, backlog
}

// p99Rise is the pooled p99 of the quiet tenants' accepted exports in the
// noisy round over the baseline's, less 1.
func (c comparison) p99Rise() float64 {
	return float64(c.noisy.QuietP99Ms)/float64(c.base.QuietP99Ms) - 1
}

// target is one of the benchmark's targets as this comparison measured it.
type target struct {
	Name, Measured string
	Pass           bool
}

// targets evaluates the benchmark's targets on the comparison.
func (c comparison) targets() []target {
	lowest, pooled := c.quietAcceptance()
	lost, backlog := c.quietLoss()
	rise := c.p99Rise()
	var refused, hinted int64
	if nt := c.noisy.noisy(); nt != nil {
		refused, hinted = nt.Refused()
	}
	ooms := c.base.OOMKills + c.noisy.OOMKills
	return []target{
		{
			Name:     "the nine quiet tenants keep >= 99 % of the acceptance they have without the noisy tenant",
			Measured: fmt.Sprintf("lowest tenant %s, pooled %s", pct(lowest, 1), pct(pooled, 1)),
			Pass:     lowest >= targetAcceptance-slack,
		},
		{
			Name:     "the quiet tenants lose nothing",
			Measured: fmt.Sprintf("%.0f spans lost, %.0f still in their agents after the drain", lost, backlog),
			Pass:     lost == 0 && backlog == 0 && c.noisy.Drained,
		},
		{
			Name:     "their p99 latency rises <= 10 %",
			Measured: fmt.Sprintf("%s -> %s ms (%s)", opt(float64(c.base.QuietP99Ms), 1), opt(float64(c.noisy.QuietP99Ms), 1), signedPct(rise)),
			Pass:     rise <= targetP99Rise+slack,
		},
		{
			Name:     "the noisy tenant's excess is refused with retry hints",
			Measured: fmt.Sprintf("%d exports refused, %d with Retry-After", refused, hinted),
			Pass:     refused > 0 && hinted == refused,
		},
		{
			Name:     "0 OOM kills",
			Measured: strconv.FormatUint(ooms, 10),
			Pass:     ooms == 0,
		},
	}
}

func sum(v []int64) int64 {
	var s int64
	for _, x := range v {
		s += x
	}
	return s
}

// zeroNaN is v, or def when v is NaN.
func zeroNaN(v, def float64) float64 {
	if math.IsNaN(v) {
		return def
	}
	return v
}

// pct formats a ratio as a percentage; "n/a" when it is missing.
func pct(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return f64(100*v, prec) + " %"
}

// signedPct formats a change as +x % or -x %.
func signedPct(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%+.1f %%", 100*v)
}
