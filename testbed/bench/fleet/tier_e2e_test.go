// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

// requireHAProxy returns the haproxy binary bin (a name on PATH or in
// /usr/sbin, or a path), or skips the test saying why (fails it under CI).
func requireHAProxy(tb testing.TB, bin string) string {
	tb.Helper()
	p, err := haproxy.Find(bin)
	if err != nil {
		e2eskip.Missing(tb, "no balancer for the tier's tests: %v", err)
	}
	return p
}

// TestBalancerRoundRobin starts the real HAProxy with the tier's
// configuration in front of three TCP servers: it takes the configuration,
// hands successive connections to the servers in turn (as kube-proxy
// balances connections), and its statistics count each server's
// connections.
func TestBalancerRoundRobin(t *testing.T) {
	bin := requireHAProxy(t, "haproxy")
	o := defaultOptions()
	o.out, o.protocol = t.TempDir(), "http"
	g := &group{o: o, name: "lbtest"}
	defer g.stop()

	servers, connect := countingServers(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lb, err := g.startBalancer(ctx, bin, servers)
	require.NoError(t, err)
	// The health checks mark the servers up first.
	requireUp(t, lb, "r1", "r2", "r3")

	assert.Equal(t, map[string]int{"r1": 2, "r2": 2, "r3": 2}, connect(lb, 6), "round-robin over the connections")
	st, err := lb.stats()
	require.NoError(t, err)
	for _, name := range []string{"r1", "r2", "r3"} {
		assert.InDelta(t, 2, st[name].ConnsTotal, 0, name)
	}
}

// countingServers starts n TCP servers r1..rn on loopback that count the
// connections saying hello, and returns them as the balancer's servers and
// a function that opens k connections through the balancer's HTTP port
// and returns the counts so far.
func countingServers(t *testing.T, n int) ([]balancerServer, func(lb *balancer, k int) map[string]int) {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	var servers []balancerServer
	for i := range n {
		name := fmt.Sprintf("r%d", i+1)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					b := make([]byte, 5)
					if n, _ := c.Read(b); n == 5 && string(b) == "hello" {
						mu.Lock()
						got[name]++
						mu.Unlock()
						_, _ = c.Write([]byte("ok"))
					}
				}()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		servers = append(servers, balancerServer{Name: name, HTTPPort: port, GRPCPort: port})
	}
	return servers, func(lb *balancer, k int) map[string]int {
		for range k {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", lb.HTTPPort))
			require.NoError(t, err)
			_, err = c.Write([]byte("hello"))
			require.NoError(t, err)
			b := make([]byte, 2)
			_, err = c.Read(b)
			require.NoError(t, err)
			c.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(got)
	}
}

// requireUp waits until the balancer counts the servers up.
func requireUp(t *testing.T, lb *balancer, servers ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := lb.stats()
		if err != nil {
			return false
		}
		for _, s := range servers {
			if st[s].Status != "UP" {
				return false
			}
		}
		return true
	}, 10*time.Second, 100*time.Millisecond, "servers %v up", servers)
}

func TestSetupTier(t *testing.T) {
	harness.RequireCgroups(t) // checkCommon wants Linux and root
	o := defaultOptions()
	o.tier.replicas = 3
	got, err := setupTier(o)
	require.NoError(t, err)
	assert.Equal(t, []float64{0.2, 0.2, 0.1}, got.tier.cpus, "the last replica has half the CPU")
	assert.Equal(t, []float64{1, 1.5}, got.factors)
	assert.Equal(t, tierAgents, got.agents)
	assert.Equal(t, tierInterval, got.interval)
	assert.Equal(t, "tier", got.bench)
	assert.Equal(t, "none", got.agentCompression, "the agents send uncompressed")

	o.set = []string{"agents", "agent-compression"}
	o.agents, o.agentCompression = 2, ""
	got, err = setupTier(o)
	require.NoError(t, err)
	assert.Equal(t, 2, got.agents, "an -agents given is kept")
	assert.Empty(t, got.agentCompression, "an -agent-compression given is kept")

	for _, c := range []struct {
		edit func(*options)
		want string
	}{
		{func(o *options) { o.tier.cpus = []float64{0.2, 0.2} }, "-tier-cpus: want 3"},
		{func(o *options) { o.tier.cpus = []float64{0.2, 0, 0.1} }, "-tier-cpus: want 3 positive"},
		{func(o *options) { o.tier.capacities = []float64{1, 2} }, "-tier-capacity: want 3"},
		{func(o *options) { o.factors = []float64{1, 0} }, "-factor"},
		{func(o *options) { o.tier.rounds = 0 }, "-rounds"},
		{func(o *options) { o.protocol = "udp" }, "-protocol"},
	} {
		oo := defaultOptions()
		oo.tier.replicas = 3
		c.edit(&oo)
		_, err := setupTier(oo)
		assert.ErrorContains(t, err, c.want)
	}
}

// TestTierThrottleDelivers is the tier benchmark in the end-to-end suite,
// short: three throttle gateways with the shipped defaults (0.1, 0.1 and
// 0.05 CPU, 100 MiB each) behind HAProxy in TCP mode with round-robin,
// four stock agents over HTTP with their exporter's defaults (gzip), a
// 30 s burst at 1.5 times a capacity above what such a tier exports on any
// machine this runs on. It asserts what a
// replica set relies on, not throughput, which depends on the machine: no
// OOM kill and no restart in any replica, and after the drain every span
// an agent accepted is at the sink, nothing a replica acknowledged lost.
//
// Skipped off Linux, without root, where no cgroup can be created, or
// without haproxy (Debian: apt-get install haproxy; .ci/run installs it),
// and fails instead under CI.
func TestTierThrottleDelivers(t *testing.T) {
	harness.RequireCgroups(t)
	requireHAProxy(t, "haproxy")
	harness.TakeMachine(t)
	o := defaultOptions()
	o.throttleBin = distbuild.Binary(t)
	o.stockBin = distbuild.Stock(t)
	o.out = t.TempDir()
	o.tier.replicas = 3
	o.tier.cpus = []float64{0.1, 0.1, 0.05}
	o.tier.capacities = []float64{6000, 6000, 3000}
	o.memMiB = 100
	o.agents, o.set = 4, []string{"agents", "agent-compression"}
	o.warmup, o.burst, o.drainMax, o.settle = 3*time.Second, 30*time.Second, drainLimit, 5*time.Second
	o, err := setupTier(o)
	require.NoError(t, err)
	o.tier.haproxy = requireHAProxy(t, o.tier.haproxy)

	ctx, cancel := context.WithTimeout(t.Context(), drainLimit+3*time.Minute)
	defer cancel()
	tl, err := harness.CreateCSV(filepath.Join(o.out, "timeline.csv"), tierTimelineHeader)
	require.NoError(t, err)
	defer tl.Close()
	rl, err := harness.CreateCSV(filepath.Join(o.out, "timeline-replicas.csv"), replicaTimelineHeader)
	require.NoError(t, err)
	defer rl.Close()
	sc := tierScenario{name: colconfig.KindThrottle, kind: colconfig.KindThrottle}
	s, err := runTierScenario(ctx, o, o.tier.capacities, sc, 1, 1.5, tl, rl)
	require.NoError(t, err, "files in %s", o.out)
	var b strings.Builder
	printTierSummaries(&b, o, o.tier.capacities, []*tierSummary{s})
	t.Log("\n" + b.String())

	var protecting float64
	for _, r := range s.Reps {
		protecting += r.SheddingSeconds + r.OpenSeconds + r.DeniedBudget
		assert.Zero(t, r.OOMKills, "%s: OOM kills", r.Name)
		assert.Zero(t, r.Restarts, "%s: restarts", r.Name)
	}
	if protecting == 0 {
		t.Skipf("the load could not overload the tier on this machine (burst %.0f spans/s reached the sink): nothing to assert about the throttle", s.BurstSinkRate)
	}
	assert.GreaterOrEqual(t, s.DrainSeconds, 0.0, "the tier did not drain within %s", o.drainMax)
	assert.Positive(t, s.AgentAccepted)
	assert.Equal(t, s.AgentAccepted, s.SinkSpans, "every span an agent accepted reaches the sink")
	assert.Zero(t, s.Lost, "nothing a replica acknowledged is lost")
	assert.Zero(t, s.AgentEnqueueFailed+s.AgentSendFailed, "the agents dropped nothing")
}
