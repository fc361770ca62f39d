// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
)

// summaryHeader is the header of summary.csv: one row per client.
var summaryHeader = []string{
	"scenario", "client", "kind", "variant", "settings", "workers", "batch", "rate_target_spans_s", "offered_spans_s",
	"handed", "given_up", "arrived", "missing", "missing_given_up", "missing_silent", "given_up_arrived", "duplicated", "unexpected",
	"exports", "latency_p50_ms", "latency_p99_ms", "latency_max_ms", "agent_accepted", "agent_refused_requests", "killed", "result_error",
}

func (c clientOutcome) row(scenario string) []string {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	r := c.Result
	if r == nil {
		r = &result{}
	}
	offered := ""
	if r.Seconds > 0 {
		offered = strconv.FormatFloat(float64(r.Handed)/r.Seconds, 'f', 0, 64)
	}
	lat := func(k string) string {
		if v, ok := r.LatencyMS[k]; ok {
			return strconv.FormatFloat(v, 'f', 0, 64)
		}
		return ""
	}
	missingGivenUp, missingSilent := "", ""
	if c.Agent == nil {
		missingGivenUp, missingSilent = u(c.Tally.MissingGivenUp), u(c.Tally.Missing-min(c.Tally.Missing, c.Tally.MissingGivenUp))
	}
	agentAccepted := ""
	if c.Agent != nil {
		agentAccepted = strconv.FormatFloat(c.Agent.Accepted, 'f', 0, 64)
	}
	resErr := ""
	if c.ResultErr != nil {
		resErr = c.ResultErr.Error()
	}
	return []string{
		scenario, c.Spec.name(), c.Spec.kind, c.Spec.variant, c.settings(), strconv.Itoa(c.Spec.workers), strconv.FormatUint(c.Spec.batch, 10),
		strconv.FormatFloat(c.Spec.rate, 'f', 0, 64), offered,
		u(c.Handed()), u(c.GivenUp), u(c.Tally.Arrived), u(c.Tally.Missing), missingGivenUp, missingSilent,
		u(c.Tally.GivenUpArrived), u(c.Tally.Duplicated), u(c.Tally.Unexpected),
		u(r.Exports), lat("p50"), lat("p99"), lat("max"), agentAccepted, u(r.Refused), strconv.FormatBool(c.Killed), resErr,
	}
}

// settings describes what the client ran with, as it reported it.
func (c clientOutcome) settings() string {
	if c.Agent != nil {
		return "stock collector " + map[string]string{colHTTP: "otlp_http", colGRPC: "otlp_grpc"}[c.Spec.kind] + " exporter, default settings"
	}
	if c.Result == nil || len(c.Result.Settings) == 0 {
		return ""
	}
	keys := make([]string, 0, len(c.Result.Settings))
	for k := range c.Result.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+": "+c.Result.Settings[k])
	}
	return strings.Join(parts, "; ")
}

// writeReport writes summary.csv, report.md and the chart of one run.
func writeReport(o options, r *scenarioRun, m *matrix) error {
	out := r.outcome
	var rows [][]string
	for _, c := range out.Clients {
		rows = append(rows, c.row(r.scenario.name))
	}
	var chart string
	if len(out.Points) > 1 {
		chart = "timeline.png"
		title := fmt.Sprintf("Client matrix, scenario %s: %s", r.scenario.name, r.scenario.title)
		var names []string
		for _, c := range r.scenario.clients {
			names = append(names, c.name())
		}
		if err := report.WriteClientsTimeline(filepath.Join(r.dir, chart), timelineChart(title, names, out.Points)); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	if err := harness.WriteCSV(filepath.Join(r.dir, "summary.csv"), summaryHeader, rows); err != nil {
		return err
	}
	var md bytes.Buffer
	writeMarkdown(&md, o, r, m, chart)
	return os.WriteFile(filepath.Join(r.dir, "report.md"), md.Bytes(), 0o644)
}

// timelineChart is the chart's data from the run's timeline.
func timelineChart(title string, clients []string, pts []point) report.ClientsTimeline {
	tl := report.ClientsTimeline{Title: title, Load: [2]float64{math.NaN(), math.NaN()}}
	col := func(f func(p point) float64) []float64 {
		v := make([]float64, len(pts))
		for i, p := range pts {
			v[i] = f(p)
		}
		return v
	}
	tl.T = col(func(p point) float64 { return p.t })
	tl.State = col(func(p point) float64 { return p.state })
	tl.MemoryPct = col(func(p point) float64 { return 100 * p.mem })
	tl.CPUSlowPct = col(func(p point) float64 { return 100 * p.cpuSlow })
	tl.CPUPct = col(func(p point) float64 { return p.cpuPct })
	tl.Shed = col(func(p point) float64 { return p.shed })
	tl.Open = col(func(p point) float64 { return p.open })
	tl.Budget = col(func(p point) float64 { return p.budget })
	for _, p := range pts {
		if p.phase == "load" && math.IsNaN(tl.Load[0]) {
			tl.Load[0] = p.t
		}
		if p.phase == "drain" && math.IsNaN(tl.Load[1]) {
			tl.Load[1] = p.t
		}
		if !math.IsNaN(p.memHard) {
			tl.MemEnter, tl.MemHard = 100*p.memEnter, 100*p.memHard
		}
		if !math.IsNaN(p.cpuHard) {
			tl.CPUEnter, tl.CPUHard = 100*p.cpuEnter, 100*p.cpuHard
		}
	}
	tl.Stress = stressSpells(pts)
	for i, name := range clients {
		tl.Clients = append(tl.Clients, name)
		tl.Arrived = append(tl.Arrived, col(func(p point) float64 {
			if i < len(p.arrived) {
				return p.arrived[i]
			}
			return math.NaN()
		}))
	}
	return tl
}

// commit is the checkout's commit, "+dirty" when tracked files differ.
func commit() string {
	b, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(b))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}

func writeMarkdown(w io.Writer, o options, r *scenarioRun, m *matrix, chart string) {
	s, out := r.scenario, r.outcome
	fmt.Fprintf(w, "# Client matrix, scenario %s: %s\n\n", s.name, s.title)
	// The command, from the repository root, is in the machine's block.
	fmt.Fprintf(w, "Commit at the run's start: %s\n\n", o.commit)
	fmt.Fprintf(w, "```\n%s```\n\n", harness.MachineInfo(o.args))

	fmt.Fprintf(w, "## Gateway\n\n")
	queue := "default sending_queue"
	if m.gwCfg.QueueSize > 0 {
		queue = fmt.Sprintf("a sending_queue of %d batches", m.gwCfg.QueueSize)
	}
	if s.stock {
		fmt.Fprintf(w, "`%s`, the stock collector without the throttle, in a cgroup of %.2g CPU and %d MiB; the otlp receiver, "+
			"the batch processor and otlp_grpc (%s, default retry_on_failure) to the sink.\n\n",
			filepath.Base(o.stockBin), o.cpus, o.memMiB, queue)
	} else {
		fmt.Fprintf(w, "`%s` in a cgroup of %.2g CPU and %d MiB: on this 2-core machine the other cores run the clients, "+
			"the agents and the sink and can offer it twice its capacity, and the `auto` admission budget is "+
			"the smaller of a twelfth of the memory limit and 10 MiB per core (%.3g MiB here), as in a small pod. "+
			"The otlp receiver's gRPC and HTTP servers go through the throttle extension; the batch processor and otlp_grpc "+
			"(%s, default retry_on_failure) export to the sink. The throttle's settings:\n\n",
			filepath.Base(o.throttleBin), o.cpus, o.memMiB, max(1, min(float64(o.memMiB)/12, 10*o.cpus)), queue)
		settings := m.gwCfg.Throttle
		if m.gwCfg.Downstream {
			settings = strings.TrimSpace(settings + "\ndownstream: { enabled: true, endpoint: the gateway's own metrics }")
		}
		if settings == "" {
			settings = "{}   # the shipped defaults"
		}
		fmt.Fprintf(w, "```yaml\nthrottle:\n%s\n```\n\n", colconfig.Indent(2, settings))
		if !m.renamed {
			fmt.Fprintf(w, "(This distribution predates today's configuration names: the settings above are under the old names.)\n\n")
		}
	}
	if r.capacity > 0 && s.needsCapacity {
		fmt.Fprintf(w, "Capacity: %.0f spans/s (see `capacity/capacity.md` when measured in this run); the clients share %g× that.\n\n", r.capacity, s.factor)
	}

	fmt.Fprintf(w, "## What happened\n\n")
	fmt.Fprintf(w, "The clients handed spans for %s. ", s.load)
	switch s.stress {
	case stressMemory:
		fmt.Fprintf(w, "Memory pulses (a helper in the gateway's memory cgroup bringing its working set to %.0f%% of the limit) ran at:", 100*o.pulseTarget)
	case stressCPU:
		fmt.Fprintf(w, "A CPU load (a helper in the gateway's CPU cgroup keeping %.0f%% of its quota busy) ran at:", 100*o.burnShare)
	case stressBackend:
		fmt.Fprintf(w, "The backend (the sink) hung, taking the gateway's calls without answering them, at:")
	case stressSlow:
		fmt.Fprintf(w, "The backend (the sink) took one call at a time and at most %.0f spans/s, at:", s.sinkRate)
	}
	for _, st := range out.Stress {
		fmt.Fprintf(w, " %.1f–%.1f s;", st[0], st[1])
	}
	fmt.Fprintf(w, "\nthe gateway's traces state machine was Open (otelcol_throttle_state = 2, sampled every %s):\n\n", o.interval)
	if len(out.Opens) == 0 {
		fmt.Fprintf(w, "never.\n\n")
	} else {
		fmt.Fprintf(w, "| from (s) | to (s) | length (s) | longest otelcol_throttle_open_duration (s) |\n|---|---|---|---|\n")
		for _, op := range out.Opens {
			fmt.Fprintf(w, "| %.1f | %s | %s | %.1f |\n", op.From, f64(op.To, 1), f64(op.Length(), 1), op.MaxReported)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Gateway restarts %d, OOM kills %.0f; its receiver refused %.0f spans after decoding them; its exporter failed %.0f spans and could not enqueue %.0f. "+
		"Drained: %v. Foreign spans at the sink: %d. The sink's slowest answer took %s (the gateway's exporter sends a batch again after 5 s: "+
		"its spans then arrive twice).\n\n", out.Restarts, out.OOMKills, out.GatewayRefused, out.GatewaySendFailed, out.GatewayEnqueueFailed, out.Drained, out.Foreign,
		out.SinkSlowest.Round(time.Millisecond))
	writeLoadSummary(w, r)
	if len(out.GatewayLog) > 0 {
		writeCounts(w, "The gateway's log (warnings, errors, exporter retries)", out.GatewayLog)
	}

	fmt.Fprintf(w, "## Per client\n\n")
	fmt.Fprintf(w, "Handed: spans the application handed to the exporter (an agent: spans it accepted from its feeder). "+
		"Given up: spans of exports the exporter reported as failed (an agent: its `otelcol_exporter_send_failed_spans` "+
		"and `enqueue_failed_spans`). Arrived: distinct handed spans at the sink. Missing: handed, not arrived; "+
		"of them, given up by the client / lost silently (after the client was told they were taken). "+
		"Duplicated: arrivals beyond the first.\n\n")
	fmt.Fprintf(w, "| client | handed | given up | arrived | missing | missing: given up / silent | given up but arrived | duplicated | offered spans/s | export p99 ms |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range out.Clients {
		row := c.row(s.name)
		get := func(name string) string {
			for i, h := range summaryHeader {
				if h == name {
					return row[i]
				}
			}
			return ""
		}
		split := "n/a"
		if c.Agent == nil {
			split = get("missing_given_up") + " / " + get("missing_silent")
		}
		name := c.Spec.name()
		if c.ResultErr != nil {
			name += " (no result: " + c.ResultErr.Error() + ")"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | **%s** | %s | %s | %s | %s | %s |\n", name, get("handed"), get("given_up"), get("arrived"),
			get("missing"), split, get("given_up_arrived"), get("duplicated"), get("offered_spans_s"), get("latency_p99_ms"))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Settings as each client reported them:\n\n")
	for _, c := range out.Clients {
		fmt.Fprintf(w, "- %s: %s (%d workers, %d-span batches, %s spans/s asked)\n", c.Spec.name(), c.settings(), c.Spec.workers, c.Spec.batch, rateText(c.Spec.rate))
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "## What the clients logged\n\n")
	fmt.Fprintf(w, "The exporter's errors (what it returned for the batches it gave up; an agent: its log's warnings and errors) and what its library logged, by text with numbers folded to N.\n\n")
	for _, c := range out.Clients {
		fmt.Fprintf(w, "### %s\n\n", c.Spec.name())
		if len(c.Errors) == 0 && len(c.Logs) == 0 {
			fmt.Fprintf(w, "Nothing.\n\n")
			continue
		}
		writeCounts(w, "errors", c.Errors)
		writeCounts(w, "log", c.Logs)
		if c.Result != nil && c.Result.Refused > 0 {
			fmt.Fprintf(w, "The agent refused %d of its feeder's requests (sent again).\n\n", c.Result.Refused)
		}
	}
	if chart != "" {
		fmt.Fprintf(w, "## Timeline\n\n![%s](%s)\n\n", chart, chart)
	}
	fmt.Fprintf(w, "Raw: `timeline.csv`, `summary.csv`, each process's `config-*.yaml`, `log-*.txt` and `result-*.json` next to this file.\n")
}

// writeLoadSummary says what the clients offered and how the gateway
// fared over the load: its CPU and the time its traces spent Shedding and
// Open.
func writeLoadSummary(w io.Writer, r *scenarioRun) {
	var offered float64
	for _, c := range r.outcome.Clients {
		if c.Result != nil && c.Result.Seconds > 0 {
			offered += float64(c.Result.Handed) / c.Result.Seconds
		}
	}
	fmt.Fprintf(w, "The clients offered %.0f spans/s in all", offered)
	if r.scenario.needsCapacity && r.capacity > 0 {
		fmt.Fprintf(w, " (%.2f× the capacity; asked: %g×)", offered/r.capacity, r.scenario.factor)
	}
	var cpu, cpuN, shed, open, n float64
	for _, p := range r.outcome.Points {
		if p.phase != "load" {
			continue
		}
		if !math.IsNaN(p.cpuPct) {
			cpu += p.cpuPct
			cpuN++
		}
		if !math.IsNaN(p.state) {
			n++
			switch p.state {
			case 1:
				shed++
			case 2:
				open++
			}
		}
	}
	if cpuN > 0 && n > 0 {
		fmt.Fprintf(w, "; over the load the gateway used %.0f%% of its CPU quota on average, and its traces were Shedding %.0f%% "+
			"and Open %.0f%% of the time", cpu/cpuN, 100*shed/n, 100*open/n)
	}
	fmt.Fprintf(w, ".")
	// The refusals: the last sample with the gateway's counters.
	for i := len(r.outcome.Points) - 1; i >= 0; i-- {
		if p := r.outcome.Points[i]; !math.IsNaN(p.shed) {
			fmt.Fprintf(w, " The throttle refused %.0f trace requests as shed, %.0f in Open and %.0f for the admission budget, "+
				"and cut off %.0f it had admitted (told to retry).", p.shed, p.open, p.budget, p.cutOff)
			break
		}
	}
	fmt.Fprintf(w, "\n\n")
}

func rateText(r float64) string {
	if r <= 0 {
		return "as many as answered"
	}
	return strconv.FormatFloat(r, 'f', 0, 64)
}

// writeCounts lists messages by count, most frequent first (at most 12).
func writeCounts(w io.Writer, title string, m map[string]uint64) {
	if len(m) == 0 {
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	fmt.Fprintf(w, "%s:\n\n", title)
	for i, k := range keys {
		if i == 12 {
			fmt.Fprintf(w, "- … %d more kinds\n", len(keys)-12)
			break
		}
		fmt.Fprintf(w, "- %d× `%s`\n", m[k], strings.ReplaceAll(k, "`", "'"))
	}
	fmt.Fprintln(w)
}
