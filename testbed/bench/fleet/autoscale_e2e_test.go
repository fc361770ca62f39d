// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package main

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

// TestBalancerSetReady: a server the tier starts disabled gets no
// connection until setReady puts it into rotation, as a pod joins a
// Service's endpoints once ready; then round-robin includes it.
func TestBalancerSetReady(t *testing.T) {
	bin := requireHAProxy(t, "haproxy")
	o := defaultOptions()
	o.out, o.protocol = t.TempDir(), "http"
	g := &group{o: o, name: "lbready"}
	defer g.stop()
	servers, connect := countingServers(t, 2)
	servers[1].Disabled = true
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lb, err := g.startBalancer(ctx, bin, servers)
	require.NoError(t, err)
	requireUp(t, lb, "r1")
	st, err := lb.stats()
	require.NoError(t, err)
	assert.Equal(t, "MAINT", st["r2"].Status, "a disabled server is in maintenance")
	assert.Equal(t, map[string]int{"r1": 4}, connect(lb, 4), "all to the one in rotation")

	require.NoError(t, lb.setReady("r2"))
	requireUp(t, lb, "r1", "r2")
	assert.Equal(t, map[string]int{"r1": 6, "r2": 2}, connect(lb, 4), "round-robin over both once ready")
	assert.ErrorContains(t, lb.setReady("r9"), "r9", "an unknown server is an error")
}

func TestSetupAutoscale(t *testing.T) {
	harness.RequireCgroups(t) // checkCommon wants Linux and root
	o := defaultOptions()
	o.tier.replicas = 3
	o.autoscale = autoscaleOptions{signals: []string{signalCPU, signalDemand}, probePeriod: autoscaleProbePeriod}
	got, err := setupAutoscale(o)
	require.NoError(t, err)
	assert.Equal(t, []float64{0.2, 0.2, 0.2}, got.tier.cpus, "equal replicas")
	assert.Equal(t, []float64{autoscaleFactor}, got.factors)
	assert.Equal(t, autoscaleLoad, got.burst)
	assert.Equal(t, colconfig.KindThrottle, got.scenarios)
	assert.Equal(t, "replay", got.bench)
	o.protocol = "grpc"
	got, err = setupAutoscale(o)
	require.NoError(t, err)
	assert.Equal(t, "throttle,throttle+age=30s", got.scenarios, "over gRPC, with and without max_connection_age")

	for _, c := range []struct {
		edit func(*options)
		want string
	}{
		{func(o *options) { o.tier.replicas = 1 }, "at least 2 replicas"},
		{func(o *options) { o.factors = []float64{1, 2} }, "one factor"},
		{func(o *options) { o.autoscale.probePeriod = 0 }, "-autoscale-probe-period"},
		{func(o *options) { o.burst, o.set = 20*time.Second, []string{"burst"} }, "two HPA syncs"},
	} {
		oo := o
		oo.protocol = "http"
		c.edit(&oo)
		_, err := setupAutoscale(oo)
		require.ErrorContains(t, err, c.want)
	}
	_, err = parseAutoscaleScenarios("throttle,stock")
	assert.ErrorContains(t, err, `"stock"`)
}

// TestAutoscaleDemandScalesOut is the autoscaling replay in the end-to-end
// suite, short: two throttle replicas with the shipped defaults (0.1
// CPU, 100 MiB each) behind HAProxy, one in rotation, four stock agents
// over HTTP sending twice a capacity above what such a replica exports on
// any machine this runs on, and the HPA replayed on the demand signal. It
// asserts what the replay shows users: the HPA scales out to the second
// replica, which turns ready after its readiness probe and then takes
// connections; and on the way every span an agent accepted reaches the
// sink, with no OOM kill and nothing a replica acknowledged lost.
//
// Skipped off Linux, without root, where no cgroup can be created, or
// without haproxy, and fails instead under CI.
func TestAutoscaleDemandScalesOut(t *testing.T) {
	harness.RequireCgroups(t)
	requireHAProxy(t, "haproxy")
	harness.TakeMachine(t)
	o := defaultOptions()
	o.throttleBin = distbuild.Binary(t)
	o.stockBin = distbuild.Stock(t)
	o.out = t.TempDir()
	o.tier.replicas = 2
	o.tier.cpus = []float64{0.1, 0.1}
	o.tier.capacities = []float64{6000, 6000}
	o.memMiB = 100
	o.agents, o.set = 4, []string{"agents", "agent-compression", "burst"}
	o.factors = []float64{2}
	// The load lasts 50 s: a scale set at the second sync (the first one's
	// scrape can miss on a busy machine) still has a replica ready, after
	// one probe period, while the load lasts.
	o.warmup, o.burst, o.drainMax, o.settle = 3*time.Second, 50*time.Second, drainLimit, 5*time.Second
	o.autoscale = autoscaleOptions{signals: []string{signalDemand}, probePeriod: autoscaleProbePeriod}
	o, err := setupAutoscale(o)
	require.NoError(t, err)
	o.tier.haproxy = requireHAProxy(t, o.tier.haproxy)
	ctx, cancel := context.WithTimeout(t.Context(), drainLimit+3*time.Minute)
	defer cancel()
	var ws [3]*harness.CSVFile
	for i, f := range []struct {
		name   string
		header []string
	}{{"timeline.csv", tierTimelineHeader}, {"timeline-replicas.csv", replicaTimelineHeader}, {"hpa.csv", hpaHeader(2)}} {
		ws[i], err = harness.CreateCSV(filepath.Join(o.out, f.name), f.header)
		require.NoError(t, err)
		defer ws[i].Close()
	}
	sc := tierScenario{name: colconfig.KindThrottle, kind: colconfig.KindThrottle}
	run, err := runAutoscaleOnce(ctx, o, o.tier.capacities, sc, signalDemand, 1, 1, ws[0], ws[1], ws[2])
	require.NoError(t, err, "files in %s", o.out)
	var b strings.Builder
	(&autoscaleReport{o: o, caps: o.tier.capacities, runs: []*autoscaleRun{run}}).syncTables(&b)
	t.Log("\n" + b.String())

	s := run.sum
	assert.Zero(t, s.OOMKills, "OOM kills")
	assert.Zero(t, s.Restarts, "restarts")
	require.NotEmpty(t, run.syncs)
	if first := run.syncs[0]; first.scale == 1 && first.metric <= autoscaleSignals[signalDemand].target*(1+hpaTolerance) {
		t.Skipf("the load could not overload one replica on this machine (demand %.2f at the first sync): nothing to scale", first.metric)
	}
	assert.False(t, math.IsNaN(run.readyAt[1]), "the second replica turned ready")
	if added, ready := run.life[1][0], run.life[1][2]; !math.IsNaN(ready) {
		assert.GreaterOrEqual(t, ready-added, autoscaleProbePeriod.Seconds()-0.5, "ready at a readiness probe after its start, not before")
	}
	var conns float64
	for _, p := range run.sum.Reps[1:] {
		conns += p.ConnsOpened
	}
	assert.Positive(t, conns, "the balancer gave the new replica connections")
	assert.GreaterOrEqual(t, s.DrainSeconds, 0.0, "the tier did not drain within %s", o.drainMax)
	assert.Positive(t, s.AgentAccepted)
	assert.Equal(t, s.AgentAccepted, s.SinkSpans, "every span an agent accepted reaches the sink")
	assert.Zero(t, s.Lost, "nothing a replica acknowledged is lost")
	assert.Zero(t, s.AgentEnqueueFailed+s.AgentSendFailed, "the agents dropped nothing")
}
