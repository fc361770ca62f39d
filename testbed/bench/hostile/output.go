// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// summaryHeader is the header of summary.csv: one row per round.
var summaryHeader = []string{
	"round", "scenario", "pair", "window_s", "offered_items_s", "accepted_items_s", "baseline_items_s", "throughput_pct",
	"normal_requests", "normal_ok", "normal_budget", "normal_shed", "normal_open", "normal_refused", "normal_errors", "normal_refused_pct",
	"longest_budget_s", "longest_budget_proto", "longest_budget_at_s",
	"hostile_requests", "hostile_ok", "hostile_refused", "hostile_budget", "hostile_shed", "hostile_open", "hostile_other",
	"hostile_errors", "hostile_held", "hostile_refused_pct", "hostile_kinds",
	"budget_mib", "peak_ws_mib", "peak_ws_pct", "oom_kills", "restarts",
	"pass_throughput", "pass_budget", "pass_hostile_refused", "pass_no_oom", "pass",
	// the round's gateway and machine, and the findings' figures
	"gateway", "host_busy_pct",
	"batch_kind", "batch_requests", "batch_ok", "batch_budget", "batch_refused", "batch_errors", "batch_accepted_pct",
	"exit_s", "exit_killed", "peak_reserved_mib", "target", "target_measured", "pass_target",
}

func summaryRow(r *roundResult) []string {
	i := strconv.Itoa
	n, h := r.refusedShares()
	v := r.check()
	pct := ""
	if r.pair > 0 {
		pct = f64(100*r.throughputRatio(), 1)
	}
	wsPct := ""
	if r.limit > 0 {
		wsPct = f64(100*float64(r.peakWS)/float64(r.limit), 1)
	}
	var kinds []string
	for k, c := range r.hostileKinds {
		kinds = append(kinds, fmt.Sprintf("%s: %d refused, %d admitted, %d held, %d errors", k, refusals(c), c[classOK], c[classHeld], c[classError]))
	}
	slices.Sort(kinds)
	pass := func(b bool) string {
		if r.pair == 0 {
			return ""
		}
		return strconv.FormatBool(b)
	}
	busy := ""
	if r.hostBusyPct >= 0 {
		busy = f64(r.hostBusyPct, 0)
	}
	batchN, batchPct := "", ""
	if share, ok := r.batchAccepted(); ok {
		batchN, batchPct = i(total(&r.batch)), f64(100*share, 1)
	}
	exit, exitKilled := "", ""
	if r.shutdown {
		exit, exitKilled = f64(r.exitAfter.Seconds(), 1), strconv.FormatBool(r.exitKilled)
	}
	measured, reached := r.targetResult()
	targetPass := ""
	if r.target != targetCriteria {
		targetPass = pass(reached)
	}
	return []string{
		i(r.round), r.scenario, i(r.pair), f64(r.window.Seconds(), 1), f64(r.offeredItemsS, 0), f64(r.acceptedItemsS, 0), f64(r.baselineItemsS, 0), pct,
		i(r.answered()), i(r.normal[classOK]), i(r.normal[classBudget]), i(r.normal[classShed]), i(r.normal[classOpen]), i(r.normal[classRefused]), i(r.normal[classError]), f64(100*n, 2),
		f64(r.longestBudget.Seconds(), 2), r.budgetProto, f64(r.budgetAt.Seconds(), 1),
		i(total(&r.hostile)), i(r.hostile[classOK]), i(refusals(&r.hostile)), i(r.hostile[classBudget]), i(r.hostile[classShed]), i(r.hostile[classOpen]), i(r.hostile[classRefused]),
		i(r.hostile[classError]), i(r.hostile[classHeld]), f64(100*h, 2), strings.Join(kinds, "; "),
		f64(float64(r.budget)/(1<<20), 1), f64(float64(r.peakWS)/(1<<20), 0), wsPct, strconv.FormatUint(r.oomKills, 10), i(r.restarts),
		pass(v.throughput), pass(v.budget), pass(v.hostileRefused), pass(v.noOOM), pass(r.passed()),
		r.gateway, busy, r.batchKind, batchN, i(r.batch[classOK]), i(r.batch[classBudget]),
		i(r.batch[classShed] + r.batch[classOpen] + r.batch[classRefused]), i(r.batch[classError]), batchPct,
		exit, exitKilled, f64(float64(r.peakReserved)/(1<<20), 1), r.target.describe(), measured, targetPass,
	}
}

// refusalsHeader is the header of refusals.csv: the normal clients'
// requests of every bucketLen of the load phase, by class.
var refusalsHeader = []string{"round", "scenario", "from_s", "ok", "budget", "shed", "open", "refused", "error"}

// writeSummary rewrites summary.csv and refusals.csv with the rounds so
// far: an interrupted run keeps what it measured.
func writeSummary(dir string, rounds []*roundResult) error {
	var sum, ref [][]string
	for _, r := range rounds {
		sum = append(sum, summaryRow(r))
		for b, c := range r.buckets {
			row := []string{strconv.Itoa(r.round), r.scenario, f64((time.Duration(b) * bucketLen).Seconds(), 0)}
			for _, cl := range []class{classOK, classBudget, classShed, classOpen, classRefused, classError} {
				row = append(row, strconv.Itoa(c[cl]))
			}
			ref = append(ref, row)
		}
	}
	return errors.Join(harness.WriteCSV(filepath.Join(dir, "summary.csv"), summaryHeader, sum),
		harness.WriteCSV(filepath.Join(dir, "refusals.csv"), refusalsHeader, ref))
}

// writeSetup writes setup.md: what the run did, for the report.
func writeSetup(o *options, capacity float64, measured bool, hp *hostilePayloads) error {
	normal, err := loadgen.BuildPayload(loadgen.Traces, o.items, o.attrSize, loadgen.Proto, true)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "## Setup\n\n")
	fmt.Fprintf(&b, "- **Gateway**: the otelcol-throttle distribution (`%s`), throttle with its shipped defaults (`throttle: {}`) on the otlp receiver's gRPC and HTTP servers, "+
		"otlp → batch → `otlp_grpc`, in a cgroup of %g CPU and %d MiB; a fresh gateway every round.\n", filepath.Base(o.bin), o.cpus, o.memMiB)
	fmt.Fprintf(&b, "- **Sink**: a gRPC server in the harness that takes every export without decoding it (the gateway's `otlp_grpc` exporter with its defaults, gzip included, delivers to it); "+
		"a stock collector as sink would decode everything on the machine's second core, which the clients and the hostile peer need.\n")
	how := fmt.Sprintf("measured first in this run: the normal clients in closed loop, %d requests in flight per protocol, for %s after %s", o.capacityC, o.capacityDur, capacityWarmup)
	if !measured {
		how = "given with -capacity"
	}
	fmt.Fprintf(&b, "- **Capacity**: %.0f spans/s (%s).\n", capacity, how)
	fmt.Fprintf(&b, "- **Normal clients** (127.0.0.1): OTLP traces over HTTP (gzip) and gRPC (gzip), %d spans per request (%.1f KiB gzip'd, %.1f KiB decoded), "+
		"open loop at %.0f %% of the capacity (%.0f spans/s, half over each protocol), at most %d requests in flight per protocol, timeout %s, never retried; "+
		"every answer recorded with its time and, for a refusal, its reason. Each round: %s of warmup, then %s measured with the hostile peer.\n",
		o.items, float64(len(normal.Body))/1024, float64(normal.RawSize)/1024, 100*o.loadShare, o.loadShare*capacity, o.maxInflight, o.timeout, o.warmup, o.duration)
	fmt.Fprintf(&b, "- **Rounds**: a baseline round (no hostile peer) before every scenario round; each scenario is compared with the baseline before it. "+
		"The oversize compressed bodies run as two scenarios, `%s` and `%s`, so that each one's effect shows alone.\n", scenarioGzipBomb, scenarioBigLength)
	fmt.Fprintf(&b, "- **Hostile peer** (127.0.0.2, and more addresses where a scenario says so), one scenario per round; "+
		"a scenario's gateway, where it has one of its own, is its baseline round's too:\n")
	for _, sc := range o.scenarios {
		fmt.Fprintf(&b, "  - `%s`: %s.", sc, scenarioDescriptions[sc])
		if st := setupFor(o, sc); st != setupFor(o, scenarioBaseline) {
			fmt.Fprintf(&b, " Gateway: %s.", st.gw)
			if st.batchBytes > 0 {
				p := hp.batches[st.batchBytes]
				fmt.Fprintf(&b, " Honest batch client (%s): %d spans per request, %.1f MiB decoded, %.1f KiB gzip'd, one at a time, at least %s apart, timeout %s.",
					batchAddr, p.Items, float64(p.RawSize)/(1<<20), float64(len(p.Body))/1024, st.batchCycle, o.timeout)
			}
			if t := st.target.describe(); t != "" {
				fmt.Fprintf(&b, " Target: %s.", t)
			}
		}
		switch sc {
		case scenarioTrickle:
			fmt.Fprintf(&b, " Here: %d MiB from %.1f KiB on the wire, then a piece of %d bytes every %s.", o.trickleMiB, float64(len(hp.trickle.head))/1024, len(hp.trickle.pieces[0]), o.trickleEvery)
		case scenarioGzipBomb:
			for i, bb := range hp.bombs {
				fmt.Fprintf(&b, " %d MiB from %.1f KiB.", hp.bombMiB[i], float64(len(bb))/1024)
			}
		case scenarioBigLength:
			fmt.Fprintf(&b, " Here: %g × the budget, at %g MiB/s.", o.lengthFactor, o.lengthRateMiB)
		case scenarioGRPCInflate:
			fmt.Fprintf(&b, " Here: %d bytes decoded from %d gzip'd (%.0f×), %g calls/s.", len(hp.inflated), hp.inflatedWire, float64(len(hp.inflated))/float64(hp.inflatedWire), o.inflateRate)
		case scenarioHoldFlood:
			fmt.Fprintf(&b, " Here: %d HTTP and %d gRPC.", o.floodHTTP, o.floodGRPC)
		case scenarioSilentStreams:
			fmt.Fprintf(&b, " Here: %d streams.", o.silentStreams)
		case scenarioGRPCShrink, scenarioGRPCShrinkControl:
			fmt.Fprintf(&b, " Here: %d calls on %d connections every %s, each %d bytes decoded from %d gzip'd, deadline %s.",
				o.shrinkCalls, o.shrinkConns, o.shrinkEvery, len(hp.shrink), hp.shrinkWire, o.shrinkTimeout)
		case scenarioLaneTrickle, scenarioShutdown:
			fmt.Fprintf(&b, " Here: %d MiB from %.1f KiB on the wire; the first %d MiB from %.1f KiB at once, then %d bytes/s "+
				"(about %.0f KiB decompressed a second).", o.laneMiB, float64(len(hp.lane.head)+len(hp.lane.tail))/1024, o.laneHeadMiB,
				float64(len(hp.lane.head))/1024, o.laneRate, float64(hp.lane.decoded-hp.lane.headDecoded)/float64(len(hp.lane.tail))*float64(o.laneRate)/1024)
			if sc == scenarioShutdown {
				fmt.Fprintf(&b, " %d waiting Exports, deadline %s; SIGTERM %s into the load phase, killed after %s.", o.shutdownStreams, o.shutdownDeadline, o.shutdownAfter, o.shutdownGrace)
			}
		case scenarioSilentAddresses:
			fmt.Fprintf(&b, " Here: %d addresses (%s to %s), %d requests each.", o.silentAddresses, attackerAddr(0), attackerAddr(o.silentAddresses-1), o.silentConns)
		case scenarioLaneLift:
			fmt.Fprintf(&b, " Here: %d aborted requests at once, each open %s.", o.liftConns, abortAfter)
		case scenarioExemptOverdraft:
			fmt.Fprintf(&b, " Here: %d addresses (%s to %s), %d connections each, %d data points per body, %.0f KiB.", o.exemptAddresses, attackerAddr(0),
				attackerAddr(o.exemptAddresses-1), o.exemptConns, hp.exemptBody.Items, float64(hp.exemptBody.RawSize)/1024)
		}
		fmt.Fprintln(&b)
	}
	return os.WriteFile(filepath.Join(o.out, "setup.md"), b.Bytes(), 0o644)
}

// mdTable writes the results table: one line per scenario round, against
// its baseline.
func mdTable(w io.Writer, rows []map[string]string) {
	fmt.Fprintln(w, "| scenario | normal spans/s accepted (baseline) | % of baseline | normal refusals: budget / shed / open / other | normal errors | longest budget stretch | hostile requests: refused / admitted / held (of) | gateway peak working set | OOM kills | criteria |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		if r["scenario"] == scenarioBaseline {
			continue
		}
		stretch := r["longest_budget_s"] + " s"
		if r["longest_budget_proto"] != "" {
			stretch += fmt.Sprintf(" (%s, at %s s)", r["longest_budget_proto"], r["longest_budget_at_s"])
		}
		fmt.Fprintf(w, "| %s | %s (%s) | %s %% | %s / %s / %s / %s | %s | %s | %s / %s / %s (%s) | %s MiB (%s %%) | %s | %s |\n",
			r["scenario"], r["accepted_items_s"], r["baseline_items_s"], r["throughput_pct"],
			r["normal_budget"], r["normal_shed"], r["normal_open"], r["normal_refused"], r["normal_errors"], stretch,
			r["hostile_refused"], r["hostile_ok"], r["hostile_held"], r["hostile_requests"],
			r["peak_ws_mib"], r["peak_ws_pct"], r["oom_kills"], criteria(r))
	}
}

// targetTable writes the findings' targets: per scenario round with one,
// its gateway, its figure beside its baseline round's, and whether it
// reached the target; nothing when no round has one.
func targetTable(w io.Writer, rows []map[string]string) {
	byRound := map[string]map[string]string{}
	for _, r := range rows {
		byRound[r["round"]] = r
	}
	var lines []string
	for _, r := range rows {
		if r["scenario"] == scenarioBaseline || r["target"] == "" {
			continue
		}
		base := byRound[r["pair"]]
		if base == nil {
			base = map[string]string{}
		}
		reached := "**no**"
		if r["pass_target"] == "true" {
			reached = "yes"
		}
		lines = append(lines, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s / %s %% |", r["scenario"], r["gateway"], r["target"],
			base["target_measured"], r["target_measured"], reached, base["host_busy_pct"], r["host_busy_pct"]))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(w, "### The findings' targets\n\n")
	fmt.Fprintln(w, "| scenario | gateway (its baseline's too) | target | baseline round | scenario round | reached | machine busy: baseline / scenario |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "\nThese scenarios are judged by their target alone (the criteria above are shown for them too). The machine's busy share is the mean over the load phase "+
		"of all its cores (the gateway, the clients, the hostile peer and anything else on it).\n\n")
}

// criteria names the criteria a round failed, or says it passed.
func criteria(r map[string]string) string {
	var failed []string
	for _, c := range []struct{ col, name string }{
		{"pass_throughput", "throughput < 95 %"},
		{"pass_budget", "budget stretch > 2 s"},
		{"pass_hostile_refused", "normal clients refused more than the hostile peer"},
		{"pass_no_oom", "OOM kill or restart"},
	} {
		if r[c.col] == "false" {
			failed = append(failed, c.name)
		}
	}
	out := "pass"
	if len(failed) > 0 {
		out = "**FAIL**: " + strings.Join(failed, "; ")
	}
	if r["target"] != "" {
		t := "reached"
		if r["pass_target"] != "true" {
			t = "**not reached**"
		}
		out = fmt.Sprintf("target %s (%s); shown only: %s", t, r["target"], out)
	}
	return out
}

// printTable writes the results table of rounds.
func printTable(w io.Writer, rounds []*roundResult) {
	var rows []map[string]string
	for _, r := range rounds {
		row := map[string]string{}
		for i, v := range summaryRow(r) {
			row[summaryHeader[i]] = v
		}
		rows = append(rows, row)
	}
	mdTable(w, rows)
}

// writeReport writes dir/report.md and the charts from the run's files
// (summary.csv, refusals.csv, setup.md, machine.txt, timeline.csv).
func writeReport(dir string) error {
	sum, err := report.ReadCSV(filepath.Join(dir, "summary.csv"))
	if err != nil {
		return err
	}
	ref, err := report.ReadCSV(filepath.Join(dir, "refusals.csv"))
	if err != nil {
		return err
	}
	rows, buckets := sum.Rows, ref.Rows
	machine, _ := os.ReadFile(filepath.Join(dir, "machine.txt"))
	setup, _ := os.ReadFile(filepath.Join(dir, "setup.md"))
	charts, chartErr := report.GenerateHostile(dir)
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Hostile peers beside normal clients\n\n```\n%s```\n\n%s\n", machine, setup)
	fmt.Fprintf(&b, "## Results\n\n")
	mdTable(&b, rows)
	fmt.Fprintf(&b, "\nCriteria: the normal clients keep at least %.0f %% of the spans/s their baseline round got accepted; "+
		"no stretch of their budget refusals lasts over %s (a stretch runs from a budget refusal to the last budget refusal before one of their requests is accepted, per protocol, by send time); "+
		"the refusals fall on the hostile peer (the normal clients were refused nothing, or a smaller share of their requests than the hostile peer, or at most %.0f percentage point more of them than in their baseline round); "+
		"the gateway was neither OOM-killed nor restarted. A hostile request is *refused* when the gateway answered it with anything but success or ended its connection or stream, "+
		"*admitted* when it succeeded, *held* when it was still unanswered at the end of the round. Normal errors are requests without an answer within the timeout, or not sent (over the most in flight).\n\n",
		100*minThroughput, maxBudgetStretch, 100*refusalNoise)
	targetTable(&b, rows)
	fmt.Fprintf(&b, "### The hostile requests by kind\n\n")
	for _, r := range rows {
		if r["scenario"] != scenarioBaseline && r["hostile_kinds"] != "" {
			fmt.Fprintf(&b, "- `%s`: %s\n", r["scenario"], r["hostile_kinds"])
		}
	}
	fmt.Fprintf(&b, "\n### The normal clients' refusals over time\n\nRequests per %s of the load phase, by what became of them (first value: from 0 s); refusal classes and errors only where there were any.\n\n", bucketLen)
	for _, r := range rows {
		var lines []string
		for _, cl := range []string{"ok", "budget", "shed", "open", "refused", "error"} {
			var vals []string
			seen := false
			for _, bk := range buckets {
				if bk["round"] == r["round"] {
					vals = append(vals, bk[cl])
					seen = seen || (bk[cl] != "0" && bk[cl] != "")
				}
			}
			if cl == "ok" || seen {
				lines = append(lines, fmt.Sprintf("%s: %s", cl, strings.Join(vals, " ")))
			}
		}
		fmt.Fprintf(&b, "- round %s, `%s`: %s\n", r["round"], r["scenario"], strings.Join(lines, "; "))
	}
	fmt.Fprintf(&b, "\n## Charts\n\n")
	for _, c := range charts {
		fmt.Fprintf(&b, "![%s](%s)\n\n", strings.TrimSuffix(filepath.Base(c), ".png"), filepath.Base(c))
	}
	fmt.Fprintf(&b, "Raw files next to this report (git-ignored): `summary.csv` (one row per round, baselines included), `refusals.csv`, "+
		"`timeline.csv` (every %s), `answers.csv` (every normal answer), `hostile.csv` (every hostile request), the gateways' configs and logs.\n", "250 ms")
	return errors.Join(chartErr, os.WriteFile(filepath.Join(dir, "report.md"), b.Bytes(), 0o644))
}
