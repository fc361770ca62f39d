// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e || soak

package main

import (
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// harnessRun runs one scenario with the harness as a library and returns
// its summary (with the samples and the final scrape). The collector, its
// cgroup and the generator are gone when it returns.
func harnessRun(t *testing.T, o options, s scenario) *summary {
	t.Helper()
	if o.bin == "" {
		o.bin = distbuild.Binary(t)
	}
	if o.out == "" {
		o.out = t.TempDir()
	}
	// Defaults of the command's flags for what the test does not set.
	def := options{
		cpus: 1, memMiB: 300, warmup: 5 * time.Second, warmupRate: 100, duration: 30 * time.Second,
		cooldown: 3 * time.Second, cBelow: 8, maxInflight: 512, spans: 500, attrSize: 256,
		signals: "traces:9,metrics:1", protocol: "http", thresholds: "default", restartDelay: time.Second,
		interval: 250 * time.Millisecond, timeout: 10 * time.Second,
	}
	if o.cpus == 0 {
		o.cpus = def.cpus
	}
	if o.memMiB == 0 {
		o.memMiB = def.memMiB
	}
	if o.warmup == 0 {
		o.warmup = def.warmup
	}
	if o.warmupRate == 0 {
		o.warmupRate = def.warmupRate
	}
	if o.duration == 0 {
		o.duration = def.duration
	}
	if o.cooldown == 0 {
		o.cooldown = def.cooldown
	}
	if o.cBelow == 0 {
		o.cBelow = def.cBelow
	}
	if o.maxInflight == 0 {
		o.maxInflight = def.maxInflight
	}
	if o.spans == 0 {
		o.spans = def.spans
	}
	if o.attrSize == 0 {
		o.attrSize = def.attrSize
	}
	if o.signals == "" {
		o.signals = def.signals
	}
	if o.protocol == "" {
		o.protocol = def.protocol
	}
	if o.thresholds == "" {
		o.thresholds = def.thresholds
	}
	if o.restartDelay == 0 {
		o.restartDelay = def.restartDelay
	}
	if o.interval == 0 {
		o.interval = def.interval
	}
	if o.timeout == 0 {
		o.timeout = def.timeout
	}
	budget := o.warmup + o.duration + o.cooldown + 2*o.timeout + 60*time.Second
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	tl, err := os.Create(filepath.Join(o.out, "timeline.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	tw := csv.NewWriter(tl)
	_ = tw.Write(timelineHeader)
	sum, err := runScenario(ctx, o, s, tw)
	tw.Flush()
	if err != nil {
		t.Fatalf("scenario %s: %v (files in %s)", s.name, err, o.out)
	}
	if sum == nil {
		t.Fatalf("scenario %s: no summary", s.name)
	}
	if err := writeSummaries(o, []*summary{sum}); err != nil {
		t.Logf("writing the summary: %v", err)
	}
	return sum
}

// loadPhase is the generator's report of the phase named load.
func loadPhase(rep *loadgen.Report) *loadgen.PhaseReport {
	if rep == nil {
		return nil
	}
	for i := range rep.Phases {
		if rep.Phases[i].Phase.Name == "load" {
			return rep.Phases[i]
		}
	}
	return nil
}
