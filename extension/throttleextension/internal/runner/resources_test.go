// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// testResources are the resources of the extension's defaults.
func testResources() []resource {
	cfg := testConfig()
	return cfg.resources(nil, func(*sampler.WaterLevel) sampler.Level { return sampler.Level{} })
}

// testSlots are their slots at a 250ms check interval.
func testSlots() []decision.Slot {
	var slots []decision.Slot
	for _, r := range testResources() {
		slots = append(slots, r.slot(250*time.Millisecond))
	}
	return slots
}

// levels fills wl's levels from its CPU and memory fields, as the
// sampler's readers of testResources do.
func levels(wl *sampler.WaterLevel) *sampler.WaterLevel {
	for i, r := range testResources() {
		wl.Levels[i] = r.read(wl)
	}
	return wl
}

// TestResources: CPU and memory are registered at their documented
// defaults, CPU as a rate whose level has averages, memory as a level and
// the backstop, relieved at its hard line.
func TestResources(t *testing.T) {
	relieved := 0
	cfg := testConfig()
	downstreamLevel := sampler.Level{Valid: true, Value: 0.6, Slow: 0.6, Fast: 0.6}
	rs := cfg.resources(func() { relieved++ }, func(*sampler.WaterLevel) sampler.Level { return downstreamLevel })
	slots := make([]decision.Slot, len(rs))
	for i := range rs {
		slots[i] = rs[i].slot(250 * time.Millisecond)
	}
	assert.Equal(t, []string{"cpu", "memory", "downstream"}, []string{rs[0].name, rs[1].name, rs[2].name})
	assert.Equal(t, decision.Slot{
		Name: "cpu", Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachN: 3, MaxShed: 0.2, Severity: decision.SeverityRate,
	}, slots[0])
	mem := slots[1]
	assert.NotNil(t, mem.Relieve)
	mem.Relieve()
	assert.Equal(t, 1, relieved)
	mem.Relieve = nil
	assert.Equal(t, decision.Slot{
		Name: "memory", Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachN: 1, MaxShed: 1, Severity: decision.SeverityLevel, Backstop: true,
	}, mem)
	assert.True(t, rs[0].averaged)
	assert.False(t, rs[1].averaged)
	// The exporters' queues: off unless asked for; a level like memory's,
	// but no backstop (the exempt signals pass a full queue).
	assert.Equal(t, decision.Slot{
		Name: "downstream", Enabled: false, Enter: 0.5, Exit: 0.3, Hard: 0.8, BreachN: 1, MaxShed: 1, Severity: decision.SeverityLevel,
	}, slots[2])
	assert.Equal(t, downstreamLevel, rs[2].read(nil))
	// With the hold on, a backend that stays slow is refused at once after
	// twice the hold's longest wait.
	cfg.Hold = admission.NewDefaultHoldConfig()
	assert.Equal(t, 2*admission.DefaultHoldMaxWait, cfg.resources(nil, nil)[2].slot(250*time.Millisecond).HoldFor)
	assert.Zero(t, cfg.resources(nil, nil)[0].slot(250*time.Millisecond).HoldFor, "CPU: held as long as it lasts")
	assert.Zero(t, cfg.resources(nil, nil)[1].slot(250*time.Millisecond).HoldFor, "memory: held as long as it lasts")

	wl := &sampler.WaterLevel{CPU: 0.5, CPUSlow: 0.4, CPUFast: 0.6, CPUValid: true, Mem: 0.7, MemValid: true, WorkingSet: 800, MemLimit: 1000}
	assert.Equal(t, sampler.Level{Valid: true, Value: 0.5, Slow: 0.4, Fast: 0.6}, rs[0].read(wl))
	assert.Equal(t, sampler.Level{Valid: true, Value: 0.7, Slow: 0.7, Fast: 0.7}, rs[1].read(wl))
	assert.InDelta(t, 0.8, rs[1].details[0].value(wl), 1e-12)
}

// TestDownstreamBreachInReadings: the queues' breach_duration is counted in
// their own readings, not in checks: the checks between two readings carry
// the last one, which the engine does not count, so at a check of 50ms and
// a read every 250ms a breach of 500ms is two readings, not ten.
func TestDownstreamBreachInReadings(t *testing.T) {
	f := func(check, every, breach time.Duration, want int) {
		t.Helper()
		cfg := testConfig(func(c *Config) {
			c.Downstream.Interval, c.Downstream.BreachDuration = every, breach
		})
		rs := cfg.resources(nil, nil)
		assert.Equal(t, want, rs[2].slot(check).BreachN, "check %v, read every %v, breach %v", check, every, breach)
	}
	f(50*time.Millisecond, 250*time.Millisecond, 500*time.Millisecond, 2)
	f(250*time.Millisecond, time.Second, 2*time.Second, 2)
	f(250*time.Millisecond, 50*time.Millisecond, 500*time.Millisecond, 2) // read more often than checked: in checks
	f(250*time.Millisecond, 250*time.Millisecond, 0, 1)
}
