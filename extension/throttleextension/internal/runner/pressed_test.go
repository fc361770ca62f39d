// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// TestPressed: the collector is under pressure for the oversize lane once a
// level passes its exit line, before the state changes at enter, and while
// the state is not Normal; a disabled slot never presses.
func TestPressed(t *testing.T) {
	r := newTestRunner(t, testConfig())
	at := time.Now()
	observe := func(cpu, mem float64) {
		at = at.Add(250 * time.Millisecond)
		r.engine.Observe(levels(&sampler.WaterLevel{CPU: cpu, CPUFast: cpu, CPUSlow: cpu, CPUValid: true, Mem: mem, MemValid: true, At: at}))
	}
	observe(0.5, 0.5)
	assert.False(t, r.Pressed(decision.SignalTraces), "below every exit line")
	observe(0.85, 0.5) // cpu exit 0.80 < 0.85 < enter 0.90
	assert.Equal(t, decision.StateNormal, r.State(decision.SignalTraces))
	assert.True(t, r.Pressed(decision.SignalTraces), "CPU past its exit line")
	observe(0.5, 0.80) // memory exit 0.78
	assert.True(t, r.Pressed(decision.SignalTraces), "memory past its exit line")
	observe(0.5, 0.97) // memory hard 0.92: Open
	assert.Equal(t, decision.StateOpen, r.State(decision.SignalTraces))
	assert.True(t, r.Pressed(decision.SignalTraces))

	off := newTestRunner(t, testConfig(func(c *Config) { c.CPU.Enabled = false }))
	off.engine.Observe(levels(&sampler.WaterLevel{CPU: 0.95, CPUFast: 0.95, CPUSlow: 0.95, CPUValid: true, Mem: 0.1, MemValid: true, At: at}))
	assert.False(t, off.Pressed(decision.SignalTraces), "a disabled slot never presses")
}
