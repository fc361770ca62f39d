// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

// shortOptions is the benchmark's short form: behind the proxy only, the
// throttle keyed by the tenant header, a given capacity (above what 0.1
// CPU takes of these tenants on the machines it runs on, so that the
// noisy round overloads it), 15 s rounds; about two minutes.
func shortOptions(out string) options {
	o := defaultOptions()
	o.out = out
	o.topologies = []string{topoProxy}
	o.gateways = []gateway{gateways[1]}
	o.capacity = 8000
	o.warmup, o.round, o.drainMax = 3*time.Second, 15*time.Second, 30*time.Second
	return o
}

// TestTenantsShort runs the short form end to end with the real
// distributions and HAProxy, and asserts what holds whatever the fairness
// achieves: every span is attributed to its tenant, the quiet tenants'
// agents lose nothing, every refusal answered carries Retry-After, no OOM kill,
// and the report carries its targets. The targets themselves are the
// benchmark's to measure, not this test's.
//
// Skipped off Linux, without root, where no cgroup can be created, or
// without haproxy (fails instead under CI).
func TestTenantsShort(t *testing.T) {
	harness.RequireCgroups(t)
	if _, err := haproxy.Find("haproxy"); err != nil {
		e2eskip.Missing(t, "no proxy for the tenants' short form: %v", err)
	}
	harness.TakeMachine(t)
	o := shortOptions(t.TempDir())
	o.throttleBin, o.stockBin = distbuild.Binary(t), distbuild.Stock(t)
	require.NoError(t, run(o), "files in %s", o.out)

	var results []*roundResult
	require.NoError(t, readJSON(filepath.Join(o.out, resultsFile), &results))
	require.Len(t, results, 2)
	for _, r := range results {
		assert.Zero(t, r.SinkOther+r.SinkBad, "%s: every span at the sink is a known tenant's", r.Name)
		assert.Zero(t, r.OOMKills, "%s: OOM kills", r.Name)
		assert.True(t, r.Drained, "%s: the quiet tenants' agents drained", r.Name)
		for _, tr := range r.Tenants {
			assert.Positive(t, tr.Delivered, "%s %s", r.Name, tr.Tenant)
			// Every answer the gateway gave carries Retry-After. An answer
			// may be lost between the proxy and the client: the gateway closes
			// the connection of a refused body over 64 KiB unread, and the
			// client's write can fail before it reads the 429 (counted as no
			// answer, and retried without the hint).
			refused, hinted := tr.Refused()
			assert.Equal(t, refused-tr.Exports[classError], hinted,
				"%s %s: every refusal answered carries Retry-After (exports by answer %v: %v)", r.Name, tr.Tenant, classNames, tr.Exports)
			if !tr.Noisy {
				assert.Zero(t, tr.Lost(), "%s %s: lost", r.Name, tr.Tenant)
				assert.Zero(t, tr.Backlog(), "%s %s: left in the agent", r.Name, tr.Tenant)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(o.out, reportFile))
	require.NoError(t, err)
	assert.Contains(t, string(md), "| the quiet tenants lose nothing | pass: 0 spans lost")
	t.Logf("\n%s", md)
}
