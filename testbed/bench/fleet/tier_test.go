// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

// requireHAProxy returns the haproxy binary, or skips the test saying why.
func requireHAProxy(tb testing.TB) string {
	tb.Helper()
	bin, err := haproxy.Find("haproxy")
	if err != nil {
		tb.Skipf("no balancer: %v", err)
	}
	return bin
}

// TestBalancerRoundRobin starts the real HAProxy with the tier's
// configuration in front of three TCP servers: it takes the configuration,
// hands successive connections to the servers in turn (as kube-proxy
// balances connections), and its statistics count each server's
// connections.
func TestBalancerRoundRobin(t *testing.T) {
	bin := requireHAProxy(t)
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

func TestParseTierScenarios(t *testing.T) {
	s, err := parseTierScenarios("all")
	require.NoError(t, err)
	var names []string
	for _, sc := range s {
		names = append(names, sc.name)
	}
	assert.Equal(t, []string{"stock", "memory_limiter", "throttle"}, names)

	s, err = parseTierScenarios("throttle+age=30s, stock+gomemlimit")
	require.NoError(t, err)
	assert.Equal(t, []tierScenario{
		{name: "throttle+age=30s", kind: colconfig.KindThrottle, connAge: 30 * time.Second},
		{name: "stock+gomemlimit", kind: colconfig.KindStock, gomemlimit: true},
	}, s)

	for in, want := range map[string]string{
		"nginx":            `unknown gateway "nginx"`,
		"throttle+age=0s":  "want a positive duration",
		"throttle+age=x":   "want a positive duration",
		"throttle+fast":    `unknown suffix "fast"`,
		"throttle+,stock":  `unknown suffix ""`,
		"stock,,throttle":  `unknown gateway ""`,
		"throttle+age=-1s": "want a positive duration",
	} {
		_, err := parseTierScenarios(in)
		assert.ErrorContains(t, err, want, in)
	}
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

func TestReplicaCapacities(t *testing.T) {
	caps, hows := replicaCapacities([]float64{0.2, 0.2, 0.1}, map[float64]float64{0.2: 16000})
	assert.Equal(t, []float64{16000, 16000, 8000}, caps, "the smaller size scaled by its CPU")
	assert.Equal(t, []string{"measured", "measured", "the 0.2 CPU's × 0.1 / 0.2"}, hows)
	caps, _ = replicaCapacities([]float64{0.2, 0.2, 0.1}, map[float64]float64{0.2: 16000, 0.1: 7000})
	assert.Equal(t, []float64{16000, 16000, 7000}, caps, "each size measured")
}

func TestIncrease(t *testing.T) {
	nan := math.NaN()
	assert.InDelta(t, 30.0, increase([]float64{10, 20, 40}), 0)
	assert.InDelta(t, 30.0, increase([]float64{nan, 10, nan, 20, 40, nan}), 0, "missing values skipped")
	// Restarted at 25 (5 after the restart): 10 + 5 + 10.
	assert.InDelta(t, 25.0, increase([]float64{10, 20, 5, 15}), 0, "a fall is a restart from 0")
	assert.InDelta(t, 0.0, increase([]float64{nan, nan}), 0)
	assert.InDelta(t, 0.0, increase(nil), 0)
}

// TestTierChecks: issue 30's targets, round by round, for the throttle
// scenarios only.
func TestTierChecks(t *testing.T) {
	sums := []*tierSummary{
		{Scenario: "stock", Gateway: colconfig.KindStock, Round: 1, Factor: 1, BurstSinkRate: 1000},
		{Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 1, Factor: 1, BurstSinkRate: 960},
		{Scenario: "stock", Gateway: colconfig.KindStock, Round: 2, Factor: 1, BurstSinkRate: 1000},
		{Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 2, Factor: 1, BurstSinkRate: 940},
		{
			Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 1, Factor: 1.5, BurstSinkRate: 950, BurstPctCapacity: 95,
			delivery: delivery{AgentAccepted: 100, SinkSpans: 100}, WeakReplica: "r3", WeakShare: 30, WeakCapShare: 20,
		},
		{
			Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 2, Factor: 1.5, BurstSinkRate: 800, BurstPctCapacity: 80,
			delivery: delivery{AgentAccepted: 100, SinkSpans: 90, AgentSent: 95, Lost: 5}, OOMKills: 1, WeakReplica: "r3", WeakShare: 31, WeakCapShare: 20,
		},
	}
	met := map[string]bool{}
	for _, c := range tierChecks(sums) {
		met[fmt.Sprintf("%d %g %s", c.round, c.factor, c.target)] = c.met
	}
	assert.Equal(t, map[string]bool{
		"1 1 burst throughput ≥ 0.95× the stock tier's":                  true,
		"2 1 burst throughput ≥ 0.95× the stock tier's":                  false,
		"1 1.5 delivers 100%":                                            true,
		"1 1.5 nothing acknowledged lost":                                true,
		"1 1.5 no OOM kill":                                              true,
		"1 1.5 burst ≥ 90% of the summed capacity":                       true,
		"1 1.5 burst not less than at 1×":                                false,
		"1 1.5 weakest replica's share ≤ its capacity share + 10 points": true,
		"2 1.5 delivers 100%":                                            false,
		"2 1.5 nothing acknowledged lost":                                false,
		"2 1.5 no OOM kill":                                              false,
		"2 1.5 burst ≥ 90% of the summed capacity":                       false,
		"2 1.5 burst not less than at 1×":                                false,
		"2 1.5 weakest replica's share ≤ its capacity share + 10 points": false,
	}, met)
}

// TestTierThrottleDelivers is the tier benchmark in the normal test suite,
// short: three throttle gateways with the shipped defaults (0.1, 0.1 and
// 0.05 CPU, 100 MiB each) behind HAProxy in TCP mode with round-robin,
// four stock agents over HTTP with their exporter's defaults (gzip), a
// 30 s burst at 1.5 times a capacity above what such a tier exports on any
// machine this runs on. It asserts what a
// replica set relies on, not throughput, which depends on the machine: no
// OOM kill and no restart in any replica, and after the drain every span
// an agent accepted is at the sink, nothing a replica acknowledged lost.
//
// Skipped with -short, off Linux, without root, where no cgroup can be
// created, or without haproxy (Debian: apt-get install haproxy; .ci/run
// installs it).
func TestTierThrottleDelivers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds two distributions and runs a replica set for about two minutes")
	}
	harness.RequireCgroups(t)
	harness.TakeMachine(t)
	requireHAProxy(t)
	o := defaultOptions()
	o.throttleBin = distbuild.Binary(t)
	o.stockBin = distbuild.Stock(t)
	o.out = t.TempDir()
	o.tier.replicas = 3
	o.tier.cpus = []float64{0.1, 0.1, 0.05}
	o.tier.capacities = []float64{6000, 6000, 3000}
	o.memMiB = 100
	o.agents, o.set = 4, []string{"agents", "agent-compression"}
	o.warmup, o.burst, o.drainMax, o.settle = 3*time.Second, 30*time.Second, 2*time.Minute, 5*time.Second
	o, err := setupTier(o)
	require.NoError(t, err)
	if o.tier.haproxy, err = haproxy.Find(o.tier.haproxy); err != nil {
		t.Skip(err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
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

// TestWriteTierReport: the tier's report carries the run's machine, commit
// and command above its tables, so that make promote can take it.
func TestWriteTierReport(t *testing.T) {
	dir := t.TempDir()
	require.Error(t, writeTierReport(dir, "grpc"), "no machine.txt")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "machine.txt"), []byte("date (UTC)  2026-12-04T03:07:44Z\ncommit      36bfe4e\ncommand     bin/fleet -tier 3\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "summary.md"), []byte("| round |\n"), 0o644))
	require.NoError(t, writeTierReport(dir, "grpc"))
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Equal(t, "# Gateway tier, OTLP/GRPC agents\n\n```\ndate (UTC)  2026-12-04T03:07:44Z\ncommit      36bfe4e\ncommand     bin/fleet -tier 3\n```\n\n| round |\n", string(md))
	info := harness.ParseRunInfo(string(md))
	assert.Equal(t, "36bfe4e", info.Commit, "make promote reads the commit")
	assert.Equal(t, "bin/fleet -tier 3", info.Command)
}
