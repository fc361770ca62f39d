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
