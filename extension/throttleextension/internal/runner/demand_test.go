// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/otelthrottle/throttle/internal/sampler"
)

// TestDemand: the demand signal is the utilisation while everything is
// admitted at once, and grows with what is refused (open-loop clients) and
// with what waits in the hold (closed-loop clients), where utilisation
// stays at the enter line.
func TestDemand(t *testing.T) {
	rs := testResources()
	rs[2].lines.Enabled = true // the exporters' queues
	f := func(name string, cpu, mem, queue float64, admitted, refused uint64, inflight, held int64, want float64) {
		t.Helper()
		var d demandMeter
		t0 := time.Unix(0, 0)
		for i := range 200 { // 50 s of samples: smoothed to the steady value
			at := t0.Add(time.Duration(i) * 250 * time.Millisecond)
			wl := &sampler.WaterLevel{CPUSlow: cpu, CPUValid: true, Mem: mem, MemValid: mem > 0, At: at}
			for i, r := range rs {
				wl.Levels[i] = r.read(wl)
			}
			wl.Levels[2] = sampler.Level{Valid: true, Value: queue, Slow: queue, Fast: queue}
			level, backendBound := demandLevel(rs, wl)
			d.observe(at, level, backendBound, admitted*uint64(i), refused*uint64(i), inflight, held)
		}
		assert.InDelta(t, want, d.load(), 0.01, name)
	}
	f("idle", 0.05, 0, 0, 0, 0, 0, 0, 0.05)
	f("busy, nothing refused or held", 0.6, 0.3, 0, 100, 0, 8, 0, 0.6)
	f("memory the larger", 0.3, 0.7, 0, 100, 0, 8, 0, 0.7)
	f("half refused", 0.9, 0, 0, 100, 100, 8, 0, 1.8)
	f("as many held as served", 0.9, 0, 0, 100, 0, 10, 10, 1.8)
	f("both", 0.9, 0, 0, 100, 100, 10, 10, 3.6)
	f("capped", 1.0, 0, 0, 1, 100, 1, 100, demandMax)
	// The exporters' queues are no capacity: a full queue adds nothing, and
	// while one is past its exit line what is refused and held is the
	// backend's doing, not demand more replicas would serve.
	f("a full queue", 0.2, 0, 0.9, 100, 0, 8, 0, 0.2)
	f("refused for a full queue", 0.2, 0, 0.9, 100, 300, 10, 10, 0.2)
	f("a queue below its exit line", 0.9, 0, 0.1, 100, 100, 8, 0, 1.8)
}

// TestDemandAfterTheBackendRecovers: the refusals of a backend's Open stay
// out of the demand once the queue has drained too, though they are within
// the last demandWindow: an autoscaler would scale out after every outage.
func TestDemandAfterTheBackendRecovers(t *testing.T) {
	rs := testResources()
	rs[2].lines.Enabled = true // the exporters' queues
	var d demandMeter
	t0 := time.Unix(0, 0)
	var admitted, refused uint64
	peak := 0.0
	for i := range 240 { // 60 s at 250ms
		at := t0.Add(time.Duration(i) * 250 * time.Millisecond)
		queue := 0.9 // the backend hangs: Open, nearly everything refused
		if i >= 120 {
			queue = 0.1 // 30 s on it has recovered: nothing refused any more
		}
		if queue > 0.5 {
			admitted, refused = admitted+1, refused+100
		} else {
			admitted += 100
		}
		wl := &sampler.WaterLevel{CPUSlow: 0.5, CPUValid: true, At: at}
		for j, r := range rs {
			wl.Levels[j] = r.read(wl)
		}
		wl.Levels[2] = sampler.Level{Valid: true, Value: queue, Slow: queue, Fast: queue}
		level, backendBound := demandLevel(rs, wl)
		d.observe(at, level, backendBound, admitted, refused, 8, 0)
		if i >= 120 {
			peak = max(peak, d.load())
		}
	}
	assert.LessOrEqual(t, peak, 0.6, "demand after the backend recovered, with CPU at 0.5 and nothing refused: peak %.2f", peak)
}

// TestDemandCountsCPURefusalsBesideAQueue: below its enter line a queue
// refuses nothing, and the refusals are CPU's.
func TestDemandCountsCPURefusalsBesideAQueue(t *testing.T) {
	rs := testResources()
	rs[2].lines.Enabled = true
	var d demandMeter
	t0 := time.Unix(0, 0)
	for i := range 200 {
		at := t0.Add(time.Duration(i) * 250 * time.Millisecond)
		wl := &sampler.WaterLevel{CPUSlow: 0.9, CPUValid: true, At: at}
		for j, r := range rs {
			wl.Levels[j] = r.read(wl)
		}
		// A third full: above exit (0.3), below enter (0.5).
		wl.Levels[2] = sampler.Level{Valid: true, Value: 0.35, Slow: 0.35, Fast: 0.35}
		level, backendBound := demandLevel(rs, wl)
		d.observe(at, level, backendBound, 100*uint64(i), 100*uint64(i), 8, 0)
	}
	assert.InDelta(t, 1.8, d.load(), 0.01, "half refused for CPU at 0.9 is demand 1.8, as with the queue below exit")
}
