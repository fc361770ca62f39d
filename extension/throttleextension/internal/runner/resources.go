// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/downstream"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/softlimit"
)

// A resource is one level the throttle holds to lines: a reader, which
// gives its level at every check, and a slot, which the decision engine
// holds that level to. Everything else follows the list resources returns:
// the engine's slots, the sampler's readers, the telemetry's water_level
// kinds, the transition log, the status page and the demand signal. Adding
// one is a reader, a section of the configuration, and an entry there.
type resource struct {
	name  string
	lines decision.Lines
	// severity, backstop and relieve are how the engine sheds for it (see
	// decision.Slot).
	severity decision.Severity
	backstop bool
	relieve  func()
	// holdFor bounds how long into its pressure a refusal is held
	// (decision.Slot.HoldFor); 0: as long as it lasts.
	holdFor time.Duration
	// averaged: the level has slow and fast averages beside the level
	// itself, which the telemetry, the logs and the status page show.
	averaged bool
	// capacity: the level measures what the collector itself can take,
	// which the demand signal for an autoscaler is made of.
	capacity bool
	// every is how often the level is measured anew when that is less
	// often than the checks: its breach is counted in its own readings,
	// since the checks in between carry the last one. 0: every check.
	every time.Duration
	read  sampler.Reader
	// details are more water_level kinds, each a share, that the telemetry
	// reports beside the level while it is valid.
	details []detail
}

type detail struct {
	kind  string
	value func(wl *sampler.WaterLevel) float64
}

// resources are the configured resources, in the order of the water
// level's Levels; relieveMemory runs at the memory hard line, and
// readDownstream reads the exporters' queues.
func (c *Config) resources(relieveMemory func(), readDownstream sampler.Reader) []resource {
	return []resource{
		{
			name: "cpu", lines: c.CPU.Lines, severity: decision.SeverityRate,
			averaged: true, capacity: true, read: sampler.ReadCPU,
		},
		{
			name: "memory", lines: c.Memory.Lines, severity: decision.SeverityLevel,
			backstop: true, relieve: relieveMemory, capacity: true, read: sampler.ReadMemory,
			details: []detail{
				{"memory_working_set", func(wl *sampler.WaterLevel) float64 { return share(wl.WorkingSet, wl.MemLimit) }},
				{"memory_heap_spare", func(wl *sampler.WaterLevel) float64 { return share(wl.HeapSpare, wl.MemLimit) }},
				{"memory_heap_held_back", func(wl *sampler.WaterLevel) float64 { return share(wl.HeapHeldBack, wl.MemLimit) }},
			},
		},
		{
			// A queue's fill is a level like memory's: proportional
			// severity, acted on in the frame it is read. It is no
			// backstop: the exempt signals pass a full queue. A backend
			// that stays slow drains the queue at its own pace however
			// long requests wait, so its refusals are held only for as
			// long as a hang the hold can bridge keeps the queue past its
			// lines: twice max_wait, since the queue fills before such a
			// hang and drains back under exit after it.
			name: downstream.Resource, lines: c.Downstream.Lines, severity: decision.SeverityLevel,
			every: c.Downstream.Interval, read: readDownstream, holdFor: 2 * c.Hold.MaxWait,
		},
	}
}

// share is part over whole, 0 without a whole.
func share(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// levelFields are the levels of wl as log fields: each resource's level
// ("cpu", "memory"), its averages when it has them ("cpu_slow",
// "cpu_fast"), and whether it is valid ("cpu_valid").
func levelFields(resources []resource, wl *sampler.WaterLevel) []zap.Field {
	fields := make([]zap.Field, 0, 4*len(resources))
	for i := range resources {
		r, l := &resources[i], &wl.Levels[i]
		fields = append(fields, zap.Float64(r.name, l.Value))
		if r.averaged {
			fields = append(fields, zap.Float64(r.name+"_slow", l.Slow), zap.Float64(r.name+"_fast", l.Fast))
		}
		fields = append(fields, zap.Bool(r.name+"_valid", l.Valid))
	}
	return fields
}

// demandLevel is what the demand signal takes of wl: the largest slow
// level of the capacity resources, and whether the backend is the bound: a
// resource that is no capacity (the exporters' queues) is past its enter
// line while no capacity resource is past its own, so that what is refused
// and held is the backend's doing.
func demandLevel(resources []resource, wl *sampler.WaterLevel) (level float64, backendBound bool) {
	capacityBound := false
	for i := range resources {
		r, l := &resources[i], &wl.Levels[i]
		if !l.Valid || !r.lines.Enabled && !r.capacity {
			continue
		}
		past := r.lines.Enabled && l.Slow >= r.lines.Enter
		if r.capacity {
			level = max(level, l.Slow)
			capacityBound = capacityBound || past
		} else {
			backendBound = backendBound || past
		}
	}
	return level, backendBound && !capacityBound
}

// slot is the engine's slot of r at the check interval.
func (r *resource) slot(interval time.Duration) decision.Slot {
	s := r.lines.Slot(r.name, max(interval, r.every))
	s.Severity, s.Backstop, s.Relieve, s.HoldFor = r.severity, r.backstop, r.relieve, r.holdFor
	return s
}

// CPUConfig is the cpu section: the lines CPU is held to and how it is
// measured.
type CPUConfig struct {
	decision.Lines    `mapstructure:",squash"`
	sampler.CPUConfig `mapstructure:",squash"`
}

// defaultCPUMaxShed: CPU alone sheds at most a fifth of the requests. A
// rejection costs CPU too, and clients that re-send at once answer a larger
// share with more requests, so beyond it shedding for CPU lowers goodput
// and lengthens the tail (docs/results.md has the overload sweep behind
// it); memory, which kills, keeps the full range and Open.
const defaultCPUMaxShed = 0.2

// DefaultCPUConfig is the cpu section's defaults. CPU's hard line is above
// 1 and its enter line close to it: CPU is a rate, not a level that kills,
// so Open is left to memory and every point of enter below the quota is
// throughput given away (docs/results.md). Three checks of 250ms ride out a
// CFS period's noise.
func DefaultCPUConfig() CPUConfig {
	return CPUConfig{
		Lines:     decision.Lines{Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachDuration: 750 * time.Millisecond, MaxShed: defaultCPUMaxShed},
		CPUConfig: sampler.DefaultCPUConfig(),
	}
}

// cpuBounds: the CPU lines are a share of the effective cores. Values above
// 1 are meaningful (CFS bursts, or fallback_cores below the cores actually
// used); above 2 they are a percent written as a number (enter: 90), which
// would never shed.
var cpuBounds = decision.Bounds{
	MaxLine:   2,
	Why:       ": the CPU lines are a share of the effective cores (0.9 is 90%), not a percent",
	MaxBreach: 10 * time.Second,
}

// Validate checks the section: the lines of enabled CPU, and how CPU is
// measured whether it is enabled or not (the status page and the telemetry
// show it).
func (c CPUConfig) Validate() error {
	return errors.Join(c.Lines.Check(cpuBounds), c.CPUConfig.Check())
}

// MemoryConfig is the memory section: the lines memory is held to, the
// memory limit, and the Go runtime's soft memory limit.
type MemoryConfig struct {
	decision.Lines       `mapstructure:",squash"`
	sampler.MemoryConfig `mapstructure:",squash"`
	// SoftLimit is whether and where the throttle sets the Go runtime's
	// soft memory limit; the section validates itself.
	SoftLimit softlimit.Config `mapstructure:"soft_limit"`
}

// DefaultMemoryConfig is the memory section's defaults. Memory needs a
// single check: it meets the OOM killer, which is final.
func DefaultMemoryConfig() MemoryConfig {
	return MemoryConfig{
		Lines:     decision.Lines{Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachDuration: 250 * time.Millisecond, MaxShed: 1},
		SoftLimit: softlimit.DefaultConfig(),
	}
}

// memoryBounds: memory is a share of the limit, and above 1 the kernel's
// OOM killer comes first, so a line over 1 would never be reached; a breach
// longer than 2s meets the OOM killer before the throttle acts.
var memoryBounds = decision.Bounds{MaxLine: 1, MaxBreach: 2 * time.Second}

// Validate checks the section: the lines of enabled memory, and the memory
// limit whether memory is enabled or not (the soft memory limit and the
// admission budget follow it).
func (c MemoryConfig) Validate() error {
	return errors.Join(c.Lines.Check(memoryBounds), c.MemoryConfig.Check())
}
