// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package main

import (
	"testing"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// TestOverloadD is the overload benchmark's scenario D in the end-to-end suite (about a
// minute): the distribution, throttle on with its default thresholds and
// metrics exempt, in a cgroup limited to half a CPU and 300 MiB, loaded in
// open loop with 205 KiB trace requests at 1000 req/s, about 1.7 times
// what half a CPU takes (about 600 req/s on the reference machine). Half a
// CPU rather than one so that the generator, which shares a small CI
// machine (and runs under -race), can overload it.
//
// It asserts only what the design guarantees, not throughput figures,
// which depend on the machine: no OOM kill, no restart, the throttle left
// Normal, every rejection was a 429 (no 503, no other status), and the
// exempt signal was never shed nor refused in Open while the working set
// stayed under 90 % (the memory backstop and the ramp after it refuse it
// too): exempt from shedding and Open, it is still bounded by the
// admission budget, so
// the throttle's own counters say why each of its refusals was made.
//
// Skipped off Linux, without root, or where no cgroup can be created
// (fails instead under CI).
func TestOverloadD(t *testing.T) {
	harness.RequireCgroups(t)
	harness.TakeMachine(t)
	o := options{
		cpus: 0.5, memMiB: 300, warmup: 5 * time.Second, duration: 40 * time.Second,
		cooldown: 3 * time.Second, rateOver: 1000, maxInflight: 512,
	}
	sum := harnessRun(t, o, allScenarios["D"])
	lp := loadPhase(sum.report)
	if lp == nil {
		t.Fatal("no load phase in the generator's report")
	}
	c := lp.Total
	t.Logf("load: %s for %s; sent %d, 2xx %d, 429 %d, 503 %d, other %d, transport errors %d, skipped %d; "+
		"goodput %.0f items/s, p99 ok %s; OOM kills %d, restarts %d, peak working set %.1f%%, CPU mean %.0f%% of quota; "+
		"max state %s; metrics %d sent, %d ok",
		sum.Load, lp.Issuing.Round(time.Millisecond), c.Sent, c.OK, c.Rejected, c.Unavailable, c.Other, c.Errors, c.Skipped,
		sum.Goodput, sum.P99.Round(time.Millisecond), sum.OOMKills, sum.Restarts, sum.PeakWSPct, sum.MeanCPUPct,
		stateName(sum.MaxStateTraces), sum.MetricsSent, sum.MetricsOK)

	if sum.OOMKills != 0 {
		t.Errorf("%d OOM kills", sum.OOMKills)
	}
	if sum.Restarts != 0 {
		t.Errorf("%d restarts", sum.Restarts)
	}
	if c.OK == 0 {
		t.Errorf("nothing accepted")
	}
	overloaded := float64(c.Sent+c.Skipped) >= 1.5*float64(c.OK)
	if sum.MaxStateTraces < 1 {
		if !overloaded {
			t.Skipf("the generator could not overload the collector on this machine (offered %d, accepted %d): nothing to assert about the throttle",
				c.Sent+c.Skipped, c.OK)
		}
		t.Errorf("throttle never left Normal under overload (offered %d requests, %d accepted)", c.Sent+c.Skipped, c.OK)
	}
	if c.Rejected == 0 {
		t.Errorf("no 429 under overload")
	}
	if c.Unavailable != 0 || c.Other != 0 {
		t.Errorf("rejections must be 429: got %d 503 and %d other statuses (codes %v)", c.Unavailable, c.Other, lp.Codes)
	}
	if sum.MetricsSent == 0 {
		t.Errorf("no metrics sent: the exempt signal was not exercised")
	}
	if len(sum.final) == 0 {
		t.Fatal("no final scrape of the collector's metrics")
	}
	m := lp.PerSignal[loadgen.Metrics]
	t.Logf("exempt metrics: %d sent, 2xx %d, 429 %d, transport errors %d", sum.MetricsSent, m.OK, m.Rejected, m.Errors)
	for _, reason := range []string{"shed", "open"} {
		// The memory backstop refuses an exempt signal too, at the hard
		// line (0.92 of the limit), which a working set under 90 % is not,
		// and the receivers ramp it up again after it (refused as shed).
		if sum.PeakWSPct >= 90 {
			continue
		}
		denied, _ := harness.Sum(sum.final, "otelcol_throttle_requests", map[string]string{"signal": "metrics", "decision": "denied", "reason": reason})
		if denied != 0 {
			t.Errorf("exempt metrics denied %.0f times as %s (peak working set %.1f%%)", denied, reason, sum.PeakWSPct)
		}
	}
}
