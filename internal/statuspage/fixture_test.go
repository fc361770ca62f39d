// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// testInfo is the configuration the fixtures run with (the engine's default
// lines, metrics exempt, profiles shed at most half).
func testInfo() Info {
	return Info{
		Source:         "cgroup v2 /sys/fs/cgroup/kubepods/pod-1234/otelcol",
		SampleInterval: 250 * time.Millisecond,
		Resources: []Resource{
			{Name: "cpu", Averaged: true, Lines: decision.Slot{Name: "cpu", Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachN: 3, MaxShed: 0.2}},
			{Name: "memory", Lines: decision.Slot{Name: "memory", Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachN: 1, MaxShed: 1}},
		},
		Signals: [decision.NumSignals]decision.Rule{
			{Enabled: true, DropMin: 0, DropMax: 1},
			{Enabled: false, DropMin: 0, DropMax: 1},
			{Enabled: true, DropMin: 0, DropMax: 1},
			{Enabled: true, DropMin: 0, DropMax: 0.5},
		},
		Config: testConfig(),
	}
}

// testConfig is a configuration tree as the extension hands it over: the
// page renders whatever keys it holds.
func testConfig() map[string]any {
	return map[string]any{
		"enabled":        true,
		"observe_only":   false,
		"check_interval": "250ms",
		"cpu":            map[string]any{"enabled": true, "enter": 0.9, "exit": 0.8, "hard": 1.1, "max_shed": 0.2},
		"memory": map[string]any{
			"enabled": true, "enter": 0.85, "exit": 0.78, "hard": 0.92,
			"soft_limit": map[string]any{"enabled": true, "share": 0.8, "heap_target": 0.5},
		},
		"routes": map[string]any{"http": map[string]any{}, "grpc": nil},
		"status": map[string]any{
			"endpoint": "localhost:55680", "include_metadata": false,
			"cors": map[string]any{"allowed_origins": []any{"https://a.example", "https://b.example"}},
		},
		"note": "a: b",
	}
}

// burst fills a ring with the last 10 minutes of a realistic overload ending
// at end: quiet, a rise, a plateau of 1.28 times what the CPU quota serves,
// a few huge requests that take memory over its hard line, a fall, quiet
// again. CPU cannot go far over the quota (CFS throttles it), so CPU alone
// sheds at most max_shed and memory opens. The CPU EWMAs, the states, the
// CPU controller and the recovery ramp follow the engine's, simplified;
// the counters follow the decisions. It returns the final live status too,
// so the header matches the charts.
func burst(end time.Time, interval time.Duration) (*Ring, LiveStatus) {
	info := testInfo()
	cpuT, memT := info.Resources[0].Lines, info.Resources[1].Lines
	ring := NewRingFor(interval)
	rng := rand.New(rand.NewPCG(1, 2))
	n := int(Window / interval)
	start := end.Add(-time.Duration(n-1) * interval)

	const limit = 512 << 20
	var (
		fast, slow  float64
		state, prev decision.State
		trans       Transitions
		// Streaks of frames in which each line's condition held.
		cpuEnter, memEnter, cpuHard, memHard         int
		cpuExit, memExit, cpuBelowHard, memBelowHard int
		cpuShare, pPrev                              float64
		leftOpen                                     = -1
		l                                            LiveStatus
		heap                                         = 0.42
	)
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(i) * interval)
		m := float64(i) * interval.Minutes() // minutes into the window
		// Offered load as a share of the CPU quota.
		var load float64
		switch {
		case m < 3:
			load = 0.38 + 0.04*math.Sin(m*3)
		case m < 4:
			load = 0.38 + (m-3)*0.9
		case m < 6.4:
			load = 1.28
		case m < 8:
			load = 1.28 - (m-6.4)/1.6*0.86
		default:
			load = 0.42 + 0.03*math.Sin(m*4)
		}
		// Rejections take load off the CPU: a rejected request costs a
		// little less than half of an admitted one. pPrev is the last
		// sample's drop probability.
		admitted := load * (1 - 0.6*pPrev)
		cpu := math.Max(0.02, math.Min(admitted, 1)+rng.NormFloat64()*0.025)
		if i == 0 {
			fast, slow = cpu, cpu
		} else {
			fast = 0.3*cpu + 0.7*fast
			slow = 0.05*cpu + 0.95*slow
		}
		// Memory follows the admitted load with a GC saw-tooth.
		target := 0.34 + 0.46*math.Min(admitted, 1)
		heap += (target - heap) * 0.02
		if i%37 == 0 && heap > 0.6 {
			heap -= 0.02
		}
		if i == int(6.2*float64(time.Minute)/float64(interval)) {
			heap += 0.2 // a few huge requests land at once
		}
		if heap >= memT.Hard {
			heap -= 0.005 // the relief collects while at the hard line
		}
		mem := heap + rng.NormFloat64()*0.003

		// The state machine over both slots: worsening is OR
		// over the slots, recovery AND.
		cpuEnter, memEnter = inc(cpuEnter, slow > cpuT.Enter), inc(memEnter, mem > memT.Enter)
		cpuHard, memHard = inc(cpuHard, fast >= cpuT.Hard), inc(memHard, mem >= memT.Hard)
		cpuExit, memExit = inc(cpuExit, slow < cpuT.Exit), inc(memExit, mem < memT.Exit)
		cpuBelowHard, memBelowHard = inc(cpuBelowHard, fast < cpuT.Hard), inc(memBelowHard, mem < memT.Hard)
		cpuN, memN := cpuT.BreachN, memT.BreachN
		hard := cpuHard >= cpuN || memHard >= memN
		switch state {
		case decision.StateNormal:
			if hard {
				state = decision.StateOpen
			} else if cpuEnter >= cpuN || memEnter >= memN {
				state = decision.StateShedding
			}
		case decision.StateShedding:
			if hard {
				state = decision.StateOpen
			} else if cpuExit >= cpuN && memExit >= memN {
				state = decision.StateNormal
			}
		case decision.StateOpen:
			if cpuBelowHard >= cpuN && memBelowHard >= memN {
				leftOpen = i
				if slow > cpuT.Exit || mem > memT.Exit {
					state = decision.StateShedding
				} else {
					state = decision.StateNormal
				}
			}
		}
		if state != prev {
			why := fixtureReason(prev, state, slow, fast, mem, cpuT, memT)
			for s := range decision.NumSignals {
				trans.Add(at, s, prev, state, why)
			}
			prev = state
		}

		// The CPU controller sheds what holds CPU at enter, at most
		// max_shed; memory sheds by its severity.
		switch state {
		case decision.StateShedding:
			cpuShare = math.Min(cpuT.MaxShed, math.Max(0, cpuShare+interval.Seconds()*(fast-cpuT.Enter)))
		case decision.StateNormal:
			cpuShare = math.Max(0, cpuShare-interval.Seconds()*0.1)
		}
		pDrop := 0.0
		switch state {
		case decision.StateShedding:
			pDrop = math.Max(cpuShare, math.Min(1, math.Max(0, (mem-memT.Enter)/(memT.Hard-memT.Enter))))
		case decision.StateOpen:
			pDrop = 1
		}
		// The recovery ramp after a memory Open (5 s).
		if leftOpen >= 0 && state != decision.StateOpen {
			pDrop = math.Max(pDrop, 1-float64(i-leftOpen)*interval.Seconds()/5)
		}
		pPrev = pDrop
		perSignal := load * 2500 * interval.Seconds() / 4
		l.At = at
		l.Levels[0] = sampler.Level{Valid: true, Value: cpu, Slow: slow, Fast: fast}
		// The working set holds some spare heap above the level.
		spare := 0.02 + 0.03*math.Abs(math.Sin(float64(i)/60))
		l.Levels[1] = sampler.Level{Valid: true, Value: mem, Slow: mem, Fast: mem}
		l.MemLimit, l.WorkingSet, l.Cores = limit, uint64((mem+spare)*limit), 1.5
		for s := range l.Signals {
			st := &l.Signals[s]
			rule := info.Signals[s]
			req := uint64(perSignal * (1 + 0.1*rng.NormFloat64()))
			p := 0.0
			// An exempt signal's machine runs too; its rule admits everything.
			st.State = state
			if rule.Enabled {
				switch state {
				case decision.StateShedding:
					p = rule.DropMin + (rule.DropMax-rule.DropMin)*pDrop
				case decision.StateOpen:
					p = 1
				}
			}
			st.DropProbability = p
			denied := uint64(float64(req) * p)
			st.Allowed += req - denied
			if state == decision.StateOpen {
				st.DeniedOpen += denied
			} else {
				st.DeniedShed += denied
			}
		}
		l.BudgetLimit = 24 << 20
		l.BudgetReserved = int64(float64(l.BudgetLimit) * math.Min(0.95, 0.15*load*load+0.02*rng.Float64()))
		ring.Record(l.Sample())
	}
	l.Transitions = trans.Newest()
	l.Go = GoRuntime{MemoryLimit: limit * 8 / 10, MemoryLimitSetBy: "owned by throttle", GCPercent: 100, GCPercentSetBy: "owned by throttle"}
	return ring, l
}

// fixtureReason words a change of the fixture as the extension does: the
// levels of the frame against the lines they crossed.
func fixtureReason(from, to decision.State, slow, fast, mem float64, cpuT, memT decision.Slot) string {
	var first, second []string
	add := func(list *[]string, ok bool, name string, v float64, op, line string, lv float64) {
		if ok {
			*list = append(*list, fmt.Sprintf("%s %.1f%% %s %s %.0f%%", name, v*100, op, line, lv*100))
		}
	}
	switch {
	case to == decision.StateOpen:
		add(&first, fast >= cpuT.Hard, "cpu fast", fast, "≥", "hard", cpuT.Hard)
		add(&first, mem >= memT.Hard, "memory", mem, "≥", "hard", memT.Hard)
	case from == decision.StateNormal:
		add(&first, slow > cpuT.Enter, "cpu slow", slow, ">", "enter", cpuT.Enter)
		add(&first, mem > memT.Enter, "memory", mem, ">", "enter", memT.Enter)
	case from == decision.StateShedding:
		add(&first, true, "cpu slow", slow, "<", "exit", cpuT.Exit)
		add(&first, true, "memory", mem, "<", "exit", memT.Exit)
	default:
		add(&first, true, "cpu fast", fast, "<", "hard", cpuT.Hard)
		add(&first, true, "memory", mem, "<", "hard", memT.Hard)
		add(&second, slow > cpuT.Exit, "cpu slow", slow, ">", "exit", cpuT.Exit)
		add(&second, mem > memT.Exit, "memory", mem, ">", "exit", memT.Exit)
	}
	why := strings.Join(first, ", ")
	if len(second) > 0 {
		why += "; " + strings.Join(second, ", ")
	}
	return why
}

func inc(n int, hit bool) int {
	if hit {
		return n + 1
	}
	return 0
}
