// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
)

// chartFile is a run's chart of a topology: its noisy rounds.
func chartFile(topology string) string { return "tenants-" + topology + ".png" }

// writeReport writes summary.csv, the chart and report.md of the run in
// dir from its setup.json, results.json, machine.txt and capacity.md.
func writeReport(dir string) error {
	var s setup
	if err := readJSON(filepath.Join(dir, setupFile), &s); err != nil {
		return err
	}
	var results []*roundResult
	if err := readJSON(filepath.Join(dir, resultsFile), &results); err != nil {
		return err
	}
	machine, err := os.ReadFile(filepath.Join(dir, machineFile))
	if err != nil {
		return err
	}
	capMD, _ := os.ReadFile(filepath.Join(dir, capacityFile)) // none with -capacity
	if err := harness.WriteCSV(filepath.Join(dir, summaryFile), summaryHeader, summaryRows(results)); err != nil {
		return err
	}
	var charts []string
	for _, topo := range topologies {
		var rounds []string
		for _, r := range results {
			if r.Topology == topo && r.Round == roundNoisy {
				rounds = append(rounds, r.Name)
			}
		}
		if len(rounds) == 0 {
			continue
		}
		p, err := report.TenantsChart(dir, chartFile(topo), rounds, tenantName(s.Noisy))
		if err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		charts = append(charts, filepath.Base(p))
	}
	var b bytes.Buffer
	renderReport(&b, s, results, string(machine), string(capMD), charts)
	return os.WriteFile(filepath.Join(dir, reportFile), b.Bytes(), 0o644)
}

// comparisons pairs every gateway's baseline and noisy rounds, in the
// run's order.
func comparisons(results []*roundResult) []comparison {
	var out []comparison
	for _, n := range results {
		if n.Round != roundNoisy {
			continue
		}
		for _, b := range results {
			if b.Round == roundBaseline && b.Topology == n.Topology && b.Gateway == n.Gateway {
				out = append(out, comparison{base: b, noisy: n})
				break
			}
		}
	}
	return out
}

// targetGateway is the gateway the benchmark's targets are of: behind the
// proxy, keyed by the tenant header.
const targetGateway = "throttle-tenant"

func renderReport(w io.Writer, s setup, results []*roundResult, machine, capMD string, charts []string) {
	fmt.Fprintf(w, "# Tenants: fairness per tenant behind a proxy\n\n```\n%s```\n\n", machine)
	noisyRate := s.NoisyFactor * s.Rate
	capNote := "given with -capacity"
	if s.Measured {
		capNote = "measured in this run, see the end"
	}
	fmt.Fprintf(w, "The gateway runs in a cgroup of %.2g CPU and %d MiB; its capacity is %.0f spans/s (%s). "+
		"%d tenants, each a stock collector agent (otlp_http, compression %s, `headers: { x-tenant: tenant-N }`) fed by a load generator "+
		"(%d-span requests, %d-byte attributes, the tenant in a resource attribute): the quiet ones at %.0f spans/s each "+
		"(all %d at that rate would take %.0f %% of the capacity), %s, the noisy one, at %.0f spans/s (%g times). "+
		"A baseline round offers the quiet tenants alone, %.0f %% of the capacity; the noisy round adds the noisy tenant, %.0f %% in all. "+
		"Each round: %gs of warmup, a load window of %gs, the drain (at most %gs). Every round has fresh processes.\n\n",
		s.CPUs, s.MemMiB, s.Capacity, capNote, s.Tenants, cmpStr(s.Compression, "gzip"), s.Spans, s.AttrSize, s.Rate,
		s.Tenants, 100*s.Load, tenantName(s.Noisy), noisyRate, s.NoisyFactor,
		100*float64(s.Tenants-1)*s.Rate/s.Capacity, 100*(float64(s.Tenants-1)*s.Rate+noisyRate)/s.Capacity,
		s.WarmupSeconds, s.RoundSeconds, s.DrainMaxSecs)
	fmt.Fprintf(w, "Topologies: **proxy**, the tenants' agents send to HAProxy in HTTP mode (`option forwardfor`), which reaches the gateway "+
		"from %s alone and reuses its connections for every tenant; **direct**, each agent reaches the gateway from its own address "+
		"(127.0.0.2, .3, ...). Gateways: `throttle-address` (the shipped defaults: fairness by the client's address), "+
		"`throttle-tenant` (`fairness: { key: header, header: x-tenant }`), `throttle-forwarded` "+
		"(`fairness: { key: address, trusted_proxies: [%s] }`, behind the proxy only), `stock` (no protection), "+
		"`mlext` (core's memory_limiter extension, v0.159.0).\n\n", s.ProxyAddr, s.ProxyAddr)
	fmt.Fprintf(w, "How it is measured. Between each agent and the gateway (or the proxy) a tap forwards every export from the tenant's address "+
		"and records its answer and timing. *Acceptance* is the share of the spans a tenant's agent sent (every attempt, retries included) "+
		"that the gateway accepted (2xx); the quiet tenants' is compared with their own in the baseline round of the same gateway. "+
		"*Delivered* is what the sink counted of the tenant (spans/s over the load window). *Lost* is what the tenant's agent accepted "+
		"that is neither at the sink nor still in the agent (its *backlog*) after the drain; for a tenant whose agent was still sending when the round ended "+
		"(the noisy one, whose backlog the drain does not wait for) it also counts what the gateway had accepted and not yet delivered. *p99* is of the accepted exports in the load "+
		"window, from the export's arrival at the tap to the end of the answer, pooled over the quiet tenants. *Settled* figures count only the "+
		"exports from %s into the load window on: a fresh gateway of a tenth of a core spends its first seconds at its quota, "+
		"and the budget refusals of that start fall in the baseline and the noisy round alike. Refusals are by status and "+
		"whether the answer carried Retry-After. *Host busy* is the whole machine's CPU (2 cores, shared with the agents, the proxy, this "+
		"process and whatever else runs on it), mean over the load window.\n\n", settleAfter)

	comps := comparisons(results)
	for _, topo := range topologies {
		var cs []comparison
		for _, c := range comps {
			if c.noisy.Topology == topo {
				cs = append(cs, c)
			}
		}
		if len(cs) == 0 {
			continue
		}
		title := "Behind the proxy"
		if topo == topoDirect {
			title = "Without a proxy"
		}
		fmt.Fprintf(w, "## %s: the targets\n\n", title)
		if topo == topoProxy {
			fmt.Fprintf(w, "The targets are those of `%s` behind the proxy; the other gateways are measured against them alike.\n\n", targetGateway)
		}
		targetsTable(w, cs)
	}

	fmt.Fprintf(w, "## Every gateway side by side\n\n")
	fmt.Fprint(w, "Quiet tenants' figures in the noisy round against the baseline round; the noisy tenant's in the noisy round. Host busy and gateway CPU: baseline / noisy round.\n\n")
	fmt.Fprintf(w, "| topology | gateway | quiet acceptance, noisy ÷ baseline: lowest tenant / pooled | the same, settled (from %s into the load) | quiet spans/s delivered, noisy ÷ baseline | quiet lost / backlog (spans) | quiet p99 ms, baseline → noisy | noisy tenant: spans/s offered / delivered, acceptance | noisy tenant: exports refused (with Retry-After) | OOM kills | peak working set (MiB) | gateway CPU %% of quota | host busy %% |\n", settleAfter)
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range comps {
		lowest, pooled := c.quietAcceptance()
		sLowest, sPooled := c.quietSettledAcceptance()
		lost, backlog := c.quietLoss()
		nt := c.noisy.noisy()
		noisyCells := "n/a | n/a"
		if nt != nil {
			refused, hinted := nt.Refused()
			noisyCells = fmt.Sprintf("%.0f / %s, %s | %d (%d)", float64(nt.Rate), opt(float64(nt.WindowRate), 0), pct(nt.Acceptance(), 1), refused, hinted)
		}
		fmt.Fprintf(w, "| %s | %s | %s / %s | %s / %s | %s | %.0f / %.0f | %s → %s (%s) | %s | %d / %d | %s / %s | %s / %s | %s / %s |\n",
			c.noisy.Topology, c.noisy.Gateway, pct(lowest, 1), pct(pooled, 1), pct(sLowest, 1), pct(sPooled, 1), pct(c.quietThroughput(), 1), lost, backlog,
			opt(float64(c.base.QuietP99Ms), 1), opt(float64(c.noisy.QuietP99Ms), 1), signedPct(c.p99Rise()), noisyCells,
			c.base.OOMKills, c.noisy.OOMKills, mib(c.base.PeakWSBytes), mib(c.noisy.PeakWSBytes),
			opt(float64(c.base.CPUMeanPct), 0), opt(float64(c.noisy.CPUMeanPct), 0),
			opt(float64(c.base.HostMeanPct), 0), opt(float64(c.noisy.HostMeanPct), 0))
	}
	for _, c := range charts {
		fmt.Fprintf(w, "\n![%s](%s)\n", strings.TrimSuffix(c, ".png"), c)
	}

	fmt.Fprintf(w, "\n## The gateways' own view\n\n")
	fmt.Fprintf(w, "The throttle's decisions over the round (HTTP requests, from its `otelcol_throttle_requests`), the requests it allowed and cut off later by reason (`otelcol_throttle_cut_off_requests`: their clients saw a refusal too), its time Shedding and Open in the load window, its peak in-flight bytes reserved against the budget; the drain of the quiet tenants.\n\n")
	fmt.Fprint(w, "| round | allowed | denied: shed / open / budget | cut off: budget / open / slow / stopping | Shedding / Open s | peak reserved / budget (MiB) | restarts | drained | host busy % mean / max |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		drain := "no (within the drain's limit)"
		if r.Drained {
			drain = fmt.Sprintf("yes, %ss", opt(float64(r.DrainSeconds), 0))
		}
		cut := make([]any, len(cutReasons))
		for i, c := range cutReasons {
			v, ok := r.CutOff[c]
			if !ok {
				v = num(math.NaN())
			}
			cut[i] = opt(float64(v), 0)
		}
		fmt.Fprintf(w, "| %s | %s | %s / %s / %s | %s / %s / %s / %s | %s / %s | %s / %s | %d | %s | %s / %s |\n", r.Name,
			opt(float64(r.Allowed), 0), opt(float64(r.DeniedShed), 0), opt(float64(r.DeniedOpen), 0), opt(float64(r.DeniedBudget), 0),
			cut[0], cut[1], cut[2], cut[3],
			opt(float64(r.ShedSeconds), 0), opt(float64(r.OpenSeconds), 0), mib(r.PeakReserved), mib(r.Budget),
			r.Restarts, drain, opt(float64(r.HostMeanPct), 0), opt(float64(r.HostMaxPct), 0))
	}

	fmt.Fprintf(w, "\n## Every tenant\n\n")
	fmt.Fprintf(w, "Spans unless named otherwise. Exports by answer: ok, 429 with Retry-After, 429 without, 503 with, 503 without, other status, no answer.\n")
	for _, c := range comps {
		fmt.Fprintf(w, "\n### %s, %s\n\n", c.noisy.Topology, c.noisy.Gateway)
		fmt.Fprint(w, "| tenant | round | offered spans/s | acceptance | delivered spans/s (window) | agent accepted | delivered | lost | backlog | exports ok / 429+RA / 429 / 503+RA / 503 / other / none | p50 / p99 ms | host busy % |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range c.noisy.Tenants {
			for _, r := range []*roundResult{c.base, c.noisy} {
				t := r.tenant(n.Tenant)
				if t == nil {
					continue
				}
				ex := make([]string, len(t.Exports))
				for i, v := range t.Exports {
					ex[i] = strconv.FormatInt(v, 10)
				}
				fmt.Fprintf(w, "| %s | %s | %.0f | %s | %s | %.0f | %d | %.0f | %.0f | %s | %s / %s | %s |\n", t.Tenant, r.Round, float64(t.Rate),
					pct(t.Acceptance(), 2), opt(float64(t.WindowRate), 0), float64(t.AgentAccepted), t.Delivered, t.Lost(), t.Backlog(),
					strings.Join(ex, " / "), opt(float64(t.P50Ms), 1), opt(float64(t.P99Ms), 1), opt(float64(r.HostMeanPct), 0))
			}
		}
	}
	if capMD != "" {
		fmt.Fprintf(w, "\n## Capacity\n%s", capMD)
	}
	fmt.Fprintf(w, "\n## How much to trust it\n\n")
	trust(w, comps)
}

// targetsTable writes the benchmark's targets as a table: a row per target,
// a column per gateway.
func targetsTable(w io.Writer, cs []comparison) {
	fmt.Fprintf(w, "| target |")
	for _, c := range cs {
		fmt.Fprintf(w, " %s |", c.noisy.Gateway)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(cs)))
	ts := make([][]target, len(cs))
	for i, c := range cs {
		ts[i] = c.targets()
	}
	for j := range ts[0] {
		fmt.Fprintf(w, "| %s |", ts[0][j].Name)
		for i := range cs {
			verdict := "**fail**"
			if ts[i][j].Pass {
				verdict = "pass"
			}
			fmt.Fprintf(w, " %s: %s |", verdict, ts[i][j].Measured)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// trust says how far apart the machine's load was between the rounds
// compared.
func trust(w io.Writer, comps []comparison) {
	lo, hi := math.Inf(1), math.Inf(-1)
	var worst float64
	var worstName string
	for _, c := range comps {
		b, n := float64(c.base.HostMeanPct), float64(c.noisy.HostMeanPct)
		for _, v := range []float64{b, n} {
			if !math.IsNaN(v) {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		if d := math.Abs(n - b); d > worst {
			worst, worstName = d, c.noisy.Topology+" "+c.noisy.Gateway
		}
	}
	if math.IsInf(lo, 0) {
		fmt.Fprintf(w, "The machine's busy share was not recorded.\n")
		return
	}
	p99lo, p99hi := math.Inf(1), math.Inf(-1)
	cpulo, cpuhi := math.Inf(1), math.Inf(-1)
	for _, c := range comps {
		if v := float64(c.base.QuietP99Ms); !math.IsNaN(v) {
			p99lo, p99hi = min(p99lo, v), max(p99hi, v)
		}
		if v := float64(c.base.CPUMeanPct); !math.IsNaN(v) {
			cpulo, cpuhi = min(cpulo, v), max(cpuhi, v)
		}
	}
	fmt.Fprintf(w, "The machine was %.0f to %.0f %% busy over the rounds' load windows (mean of each); within a pair the rounds differ by up to %.0f points (%s). "+
		"The noisy round adds the noisy tenant's agent and load, so it is the busier by design. Acceptance, loss and refusals are counts of what the gateway answered "+
		"and hold however busy the machine was; the latencies and the spans/s delivered move with the machine's load, so a p99 change within the gap between "+
		"two pairs' baselines, or between a pair's rounds' busy shares, is noise rather than the gateway's doing.\n", lo, hi, worst, worstName)
	if !math.IsInf(p99lo, 0) {
		fmt.Fprintf(w, "\nThe quiet tenants' p99 in the baseline rounds, the same load offered to every gateway, ranges from %.0f to %.0f ms, "+
			"the gateways' CPU then from %.0f to %.0f %% of the quota: part of that spread is the gateways' own cost, part the machine's noise, "+
			"and the 10 %% target is to be read against it.\n", p99lo, p99hi, cpulo, cpuhi)
	}
}

func mib(v num) string {
	if math.IsNaN(float64(v)) {
		return "n/a"
	}
	return f64(float64(v)/(1<<20), 1)
}

func cmpStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// summaryHeader names summary.csv's columns: a row per round and tenant,
// with the round's gateway and machine figures.
var summaryHeader = []string{
	"round", "topology", "gateway", "kind", "tenant", "noisy", "rate_spans_s", "offered", "gen_refused",
	"agent_accepted", "agent_sent", "agent_send_failed", "agent_enqueue_failed", "delivered", "lost", "backlog",
	"window_rate_spans_s", "acceptance", "settled_acceptance", "exports_ok", "exports_429_retry_after", "exports_429", "exports_503_retry_after",
	"exports_503", "exports_other", "exports_none", "spans_ok", "spans_refused", "p50_ms", "p99_ms",
	"quiet_p99_ms", "oom_kills", "restarts", "peak_ws_mib", "limit_mib", "gw_cpu_mean_pct",
	"host_busy_mean_pct", "host_busy_max_pct", "shed_s", "open_s", "allowed", "denied_shed", "denied_open", "denied_budget",
	"drained", "drain_s",
}

func summaryRows(results []*roundResult) [][]string {
	var rows [][]string
	for _, r := range results {
		for _, t := range r.Tenants {
			row := []string{
				r.Name, r.Topology, r.Gateway, r.Round, t.Tenant, b2s(t.Noisy), opt(float64(t.Rate), 0),
				strconv.FormatInt(t.Offered, 10), strconv.FormatInt(t.GenRefused, 10),
				opt(float64(t.AgentAccepted), 0), opt(float64(t.AgentSent), 0), opt(float64(t.AgentSendFailed), 0),
				opt(float64(t.AgentEnqueueFailed), 0), strconv.FormatInt(t.Delivered, 10), f64(t.Lost(), 0), f64(t.Backlog(), 0),
				opt(float64(t.WindowRate), 1), opt(t.Acceptance(), 5), opt(t.SettledAcceptance(), 5),
			}
			for _, n := range t.Exports {
				row = append(row, strconv.FormatInt(n, 10))
			}
			row = append(row, strconv.FormatInt(t.Spans[classOK], 10), strconv.FormatInt(sum(t.Spans[:])-t.Spans[classOK], 10),
				opt(float64(t.P50Ms), 2), opt(float64(t.P99Ms), 2), opt(float64(r.QuietP99Ms), 2),
				strconv.FormatUint(r.OOMKills, 10), strconv.Itoa(r.Restarts), mib(r.PeakWSBytes), mib(r.LimitBytes),
				opt(float64(r.CPUMeanPct), 1), opt(float64(r.HostMeanPct), 1), opt(float64(r.HostMaxPct), 1),
				opt(float64(r.ShedSeconds), 0), opt(float64(r.OpenSeconds), 0), opt(float64(r.Allowed), 0),
				opt(float64(r.DeniedShed), 0), opt(float64(r.DeniedOpen), 0), opt(float64(r.DeniedBudget), 0),
				b2s(r.Drained), opt(float64(r.DrainSeconds), 1))
			rows = append(rows, row)
		}
	}
	return rows
}
