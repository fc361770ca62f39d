// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

// TestMain lets the test binary serve as the matrix's helper processes
// (the Go SDK clients and the CPU pulse), as the command does.
func TestMain(m *testing.M) {
	if childMain() {
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestShortOpensLoseNothing is scenario a of the client matrix in the
// end-to-end suite (about a minute and a half): the Go SDK's and the
// JavaScript SDK's OTLP exporters over HTTP and gRPC, default settings,
// each handing 1000 spans/s in 512-span batches to the distribution in a
// 0.5 CPU / 256 MiB cgroup, while a CPU pulse of 3 s every 14 s over CPU
// lines set under the quota opens it for a few seconds, three times.
//
// It asserts what throttle promises for Opens shorter than every client's
// retry budget: every client loses 0 spans and duplicates none (counted
// exactly, span by span, at the gateway's downstream). It also asserts the
// premise: the gateway opened at least twice, no Open lasted longer than
// the shortest client budget (10 s), the gateway neither restarted nor was
// OOM-killed, and everything drained.
//
// It needs node and the JavaScript packages (`npm ci --ignore-scripts` in
// testbed/bench/clients/js; make e2e and make clients do it), and is
// skipped without them, root or cgroups (fails instead under CI).
func TestShortOpensLoseNothing(t *testing.T) {
	harness.RequireCgroups(t)
	if _, _, err := findJS("node", ""); err != nil {
		e2eskip.Missing(t, "the client matrix's JavaScript clients: %v", err)
	}
	harness.TakeMachine(t)
	o := defaultOptions()
	o.throttleBin = distbuild.Binary(t)
	o.scenarios = []string{"a"}
	o.kinds = []string{goHTTP, goGRPC, jsHTTP, jsGRPC}
	o.load = 50 * time.Second
	o.pulseFirst, o.pulseEvery = 8*time.Second, 14*time.Second
	o.drainMax = time.Minute
	o.out = t.TempDir()
	o.args = []string{"clients.test", "-test.run", t.Name()}
	runs, err := runMatrix(o)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	r := runs[0]
	out := r.outcome
	report, _ := os.ReadFile(filepath.Join(r.dir, "report.md"))
	defer func() {
		if t.Failed() {
			t.Logf("report.md:\n%s", report)
		}
	}()

	for _, op := range out.Opens {
		t.Logf("Open from %.1f s for %.1f s (longest open_duration reported %.1f s)", op.From, op.Length(), op.MaxReported)
	}
	for _, c := range out.Clients {
		t.Logf("%s: handed %d, given up %d, arrived %d, missing %d, duplicated %d; errors %v",
			c.Spec.name(), c.Handed(), c.GivenUp, c.Tally.Arrived, c.Tally.Missing, c.Tally.Duplicated, c.Errors)
	}

	// The premise: short Opens, and a gateway that held.
	assert.GreaterOrEqual(t, len(out.Opens), 2, "the CPU pulses must open the gateway: nothing was tested")
	for _, op := range out.Opens {
		assert.False(t, math.IsNaN(op.To) || op.Length() > 10, "an Open from %.1f s lasted %.1f s, longer than the shortest client budget (10 s)", op.From, op.Length())
	}
	assert.Zero(t, out.Restarts, "gateway restarts")
	assert.Zero(t, out.OOMKills, "gateway OOM kills")
	assert.True(t, out.Drained, "the gateway's queue emptied and the sink settled")

	// The promise: nothing lost, nothing twice.
	for _, c := range out.Clients {
		name := c.Spec.name()
		if !assert.NotNil(t, c.Result, "%s reported no result: %v", name, c.ResultErr) {
			continue
		}
		assert.Positive(t, c.Handed(), "%s handed nothing", name)
		assert.Zero(t, c.Tally.Missing, "%s lost %d of %d spans through Opens shorter than its retry budget (given up %d: %s)",
			name, c.Tally.Missing, c.Handed(), c.GivenUp, strings.Join(keys(c.Errors), "; "))
		assert.Zero(t, c.Tally.Duplicated, "%s: spans that arrived twice", name)
		assert.Zero(t, c.Tally.Unexpected, "%s: spans that arrived but were never handed", name)
	}
}

func keys(m map[string]uint64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
