// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

// TestHostilePeers is the short form of bench/hostile in the end-to-end
// suite (about seven minutes): the distribution with the throttle's
// shipped defaults in a cgroup of 1 CPU and 512 MiB, normal clients at half
// its capacity (measured first), and each hostile scenario for 20 s after a
// baseline round of 20 s. Each scenario is a subtest that asserts on its
// figures what a hostile peer must not do: the normal clients keep at least
// 95 % of their baseline's accepted spans/s, none of their budget
// refusals lasts over 2 s, the hostile peer's requests are the ones
// refused, and the gateway is neither OOM-killed nor restarted.
//
// The command runs built without the race detector, as make hostile runs
// it: instrumented, the clients, not the gateway, would set the capacity
// (a sixth of it on a 2-core machine).
//
// Skipped without root or where no cgroup can be created.
func TestHostilePeers(t *testing.T) {
	runHostile(t, peerScenarios, 15*time.Minute, "-warmup", "3s", "-d", "20s", "-capacity-d", "10s", "-deadline", "14m")
}

// TestHostileFindings is the short form of the findings' scenarios (about
// six minutes): each round 15 s after 3 s of warmup, the shutdown's SIGTERM
// 8 s in, each scenario a subtest that asserts its target (setups.go), or
// the criteria of TestHostilePeers for a scenario without one.
//
// Skipped without root or where no cgroup can be created.
func TestHostileFindings(t *testing.T) {
	runHostile(t, findingScenarios, 11*time.Minute, "-warmup", "3s", "-d", "15s", "-capacity-d", "10s", "-deadline", "10m",
		"-shutdown-after", "8s", "-shutdown-grace", "15s", "-shrink-every", "20s")
}

// knownGap is a scenario whose target the throttle does not meet yet: why,
// and the share of their baseline under which the normal clients'
// throughput still fails the test (0: none), so that a gap that is known
// does not hide a regression past it.
type knownGap struct {
	why   string
	floor float64
}

// notYetMet names the scenarios whose target the throttle does not meet
// yet; docs/results.md has their figures.
var notYetMet = map[string]knownGap{
	scenarioGRPCShrink:        {why: shrinkGap},
	scenarioGRPCShrinkControl: {why: shrinkGap},
	scenarioExemptOverdraft: {why: "what an exempt signal's admitted requests leave in the pipeline (the exporter's queue) is outside the budget: " +
		"with the backstop and the ramp after it, 3 OOM kills at 120 MiB in the last full run, 1 and 2 in the two before it"},
	scenarioLaneTrickle: {why: "60 of 60 honest 6 MiB batches accepted beside the trickler in the last four full runs, 47 of 60 in the one before, " +
		"where the target is 90 %; with 15 batches in the short form one refusal moves it by 7 points"},
	scenarioLaneLift: {why: "the normal clients kept 98.7 % of their baseline in the last full run, but 91.7 % in one short-form run of a CI; " +
		gzipPeerGap, floor: 0.85},
	scenarioGzipBomb: {why: "the normal clients kept 100.0 % of their baseline in the last full run (rounds of 60 s), " +
		"but 91.0 and 93.8 % in two of the last five CI runs of this short form, 93.5-100 % in twelve runs on 2026-12-07; " + gzipPeerGap, floor: 0.85},
}

// gzipPeerGap is why the gzip peer's scenarios fall short now and then in
// the short form: one Open of half a second is 4-9 % of a 20 s round.
const gzipPeerGap = "the gzip peer's admitted 16 MiB bodies (read in the oversize lane, unbounded while the collector is not under pressure) " +
	"are copied three or four times as they are decoded and exported, beyond the budget's view once read: " +
	"the memory level rises by up to a quarter of the limit within 0.4 s as they land (0.50 to 0.76 measured), " +
	"and in a round followed sample by sample (95.1 %) the signal went from Normal to Open within half a second, refusing the normal clients with the rest"

// shrinkGap is why grpc-shrink and its control fall short: the same gap.
const shrinkGap = "each call the budget lets decode leaves its 4 MB message in the pipeline, where the budget no longer counts it, " +
	"and the working set grows by about 7 MB a call, some 500 MiB a second, faster than the memory line turns Open: " +
	"peaks of 800-1024 MiB of a 1 GiB limit, an OOM kill in some runs"

// runHostile builds the command, runs scenarios with args within limit, and
// checks every scenario round.
func runHostile(t *testing.T, scenarios []string, limit time.Duration, args ...string) {
	harness.RequireCgroups(t)
	harness.TakeMachine(t)
	collector := distbuild.Binary(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "hostile")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the hostile command: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "run")
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"-collector", collector, "-out", out, "-scenarios", strings.Join(scenarios, ",")}, args...)...)
	// Interrupted, it stops its gateways and removes its cgroups itself.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = time.Minute
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	err := cmd.Run()
	t.Logf("%s\n%s", cmd, log.String())
	require.NoError(t, err)

	sum, err := report.ReadCSV(filepath.Join(out, "summary.csv"))
	require.NoError(t, err)
	rows := sum.Rows
	require.Len(t, rows, 2*len(scenarios), "a baseline and a scenario round per scenario")
	for _, r := range rows {
		if r["scenario"] == scenarioBaseline {
			continue
		}
		t.Run(r["scenario"], func(t *testing.T) {
			var fails []string
			fail := func(format string, args ...any) { fails = append(fails, fmt.Sprintf(format, args...)) }
			defer func() {
				if len(fails) == 0 {
					return
				}
				// A target not met yet is reported as a skip with what was
				// measured: visible in the output, while a regression of
				// any other scenario still fails.
				gap, ok := notYetMet[r["scenario"]]
				if ok && gap.floor > 0 && r["throughput_pct"] != "" {
					if pct, err := strconv.ParseFloat(r["throughput_pct"], 64); err != nil || pct < 100*gap.floor {
						ok = false
						fails = append(fails, fmt.Sprintf("below the %.0f %% under which the known gap no longer explains it", 100*gap.floor))
					}
				}
				if ok {
					t.Skipf("not met yet (%s): %s", gap.why, strings.Join(fails, "; "))
				}
				for _, m := range fails {
					t.Error(m)
				}
			}()
			f := func(col string) float64 {
				v, err := strconv.ParseFloat(r[col], 64)
				require.NoError(t, err, "column %s", col)
				return v
			}
			if f("hostile_requests") == 0 {
				t.Fatal("the hostile peer made no request: nothing was tested")
			}
			if r["target"] != "" {
				// A finding's scenario: its own target, the criteria
				// below are shown only.
				if r["pass_target"] != "true" {
					fail("target %s not reached: %s (its baseline round: %s; gateway %s)",
						r["target"], r["target_measured"], baselineOf(rows, r)["target_measured"], r["gateway"])
				}
				return
			}
			if pct := f("throughput_pct"); pct < 100*minThroughput {
				fail("the normal clients got %s spans/s accepted, %.1f %% of their baseline's %s (want >= %.0f %%)",
					r["accepted_items_s"], pct, r["baseline_items_s"], 100*minThroughput)
			}
			if s := f("longest_budget_s"); s > maxBudgetStretch.Seconds() {
				fail("the normal clients' budget refusals lasted %.2f s (over %s, from %s s of the load phase; want <= %s): %s budget refusals of %s requests",
					s, r["longest_budget_proto"], r["longest_budget_at_s"], maxBudgetStretch, r["normal_budget"], r["normal_requests"])
			}
			if r["pass_hostile_refused"] != "true" {
				fail("the refusals did not fall on the hostile peer: normal clients %s %% refused (budget %s, shed %s, open %s, other %s of %s), "+
					"hostile peer %s %% (%s refused, %s admitted, %s held of %s)",
					r["normal_refused_pct"], r["normal_budget"], r["normal_shed"], r["normal_open"], r["normal_refused"], r["normal_requests"],
					r["hostile_refused_pct"], r["hostile_refused"], r["hostile_ok"], r["hostile_held"], r["hostile_requests"])
			}
			if f("oom_kills") != 0 || f("restarts") != 0 {
				fail("the gateway was OOM-killed %s times and restarted %s times (peak working set %s MiB)",
					r["oom_kills"], r["restarts"], r["peak_ws_mib"])
			}
		})
	}
}

// baselineOf is the row of r's baseline round (empty when missing).
func baselineOf(rows []map[string]string, r map[string]string) map[string]string {
	for _, b := range rows {
		if b["round"] == r["pair"] {
			return b
		}
	}
	return map[string]string{}
}
