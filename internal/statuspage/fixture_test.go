// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// testInfo is the configuration the fixtures run with (the design's defaults,
// metrics exempt, profiles shed at most half).
func testInfo() Info {
	return Info{
		Source:         "cgroup v2 /sys/fs/cgroup/kubepods/pod-1234/otelcol",
		SampleInterval: 250 * time.Millisecond,
		CPU:            decision.Slot{Enabled: true, Enter: 0.80, Exit: 0.70, Hard: 0.90, BreachN: 3},
		Mem:            decision.Slot{Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachN: 1},
		Signals: [decision.NumSignals]decision.Rule{
			{Enabled: true, DropMin: 0, DropMax: 1},
			{Enabled: false, DropMin: 0, DropMax: 1},
			{Enabled: true, DropMin: 0, DropMax: 1},
			{Enabled: true, DropMin: 0, DropMax: 0.5},
		},
	}
}

// burst fills a ring with the last 10 minutes of a realistic overload ending
// at end: quiet, a rise, a plateau above the hard lines, a fall, quiet again.
// The CPU EWMAs and the states follow design §3 and §4 (simplified: no
// recovery ramp), the counters the decision of section 5. It returns the
// final live status too, so the header matches the charts.
func burst(end time.Time, interval time.Duration) (*Ring, LiveStatus) {
	info := testInfo()
	ring := NewRingFor(interval)
	rng := rand.New(rand.NewPCG(1, 2))
	n := int(Window / interval)
	start := end.Add(-time.Duration(n-1) * interval)

	const limit = 512 << 20
	var (
		fast, slow    float64
		state         decision.State
		hitsEnter     int
		pPrev         float64
		openedAt      = -1
		hitsHard      int
		hitsExit      int
		hitsBelowHard int
		l             LiveStatus
		heap          = 0.42
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
		// little less than half of an admitted one. pPrev is the last sample's drop
		// probability.
		admitted := load * (1 - 0.6*pPrev)
		cpu := math.Max(0.02, admitted+rng.NormFloat64()*0.06)
		if i == 0 {
			fast, slow = cpu, cpu
		} else {
			fast = 0.3*cpu + 0.7*fast
			slow = 0.05*cpu + 0.95*slow
		}
		// Memory follows the admitted load with a GC saw-tooth.
		target := 0.36 + 0.58*math.Min(admitted, 1.05)
		heap += (target - heap) * 0.02
		if i%37 == 0 && heap > 0.7 {
			heap -= 0.03
		}
		if i == int(6.2*float64(time.Minute)/float64(interval)) {
			heap += 0.1 // a few huge requests land at once
		}
		if heap >= info.Mem.Hard {
			heap -= 0.006 // FreeOSMemory while at the hard line
		}
		mem := heap + rng.NormFloat64()*0.004

		// State machine over both slots (design §4).
		cpuT, memT := info.CPU, info.Mem
		worse := slow > cpuT.Enter || mem > memT.Enter
		hard := fast >= cpuT.Hard || mem >= memT.Hard
		belowExit := slow < cpuT.Exit && mem < memT.Exit
		belowHard := fast < cpuT.Hard && mem < memT.Hard
		hitsEnter, hitsHard = inc(hitsEnter, worse), inc(hitsHard, hard)
		hitsExit, hitsBelowHard = inc(hitsExit, belowExit), inc(hitsBelowHard, belowHard)
		switch state {
		case decision.Normal:
			if hitsHard >= 3 {
				state = decision.Open
			} else if hitsEnter >= 3 {
				state = decision.Shedding
			}
		case decision.Shedding:
			if hitsHard >= 3 {
				state = decision.Open
			} else if hitsExit >= 3 {
				state = decision.Normal
			}
		case decision.Open:
			openedAt = i
			if hitsBelowHard >= 3 {
				if slow > cpuT.Exit || mem > memT.Exit {
					state = decision.Shedding
				} else {
					state = decision.Normal
				}
			}
		}

		// Requests over this interval: ~1000/s at a load of 0.4.
		pDrop := 0.0
		switch state {
		case decision.Shedding:
			pDrop = math.Min(1, math.Max(0, (slow-cpuT.Enter)/(cpuT.Hard-cpuT.Enter)))
			pDrop = math.Max(pDrop, math.Max(0, (mem-memT.Enter)/(memT.Hard-memT.Enter)))
			pDrop = math.Min(pDrop, 1)
		case decision.Open:
			pDrop = 1
		}
		// Recovery ramp after Open (5 s, design §4).
		if openedAt >= 0 && state != decision.Open {
			ramp := 1 - float64(i-openedAt)*interval.Seconds()/5
			pDrop = math.Max(pDrop, ramp)
		}
		pPrev = pDrop
		perSignal := load * 2500 * interval.Seconds() / 4
		l.At, l.CPU, l.CPUFast, l.CPUSlow, l.CPUValid = at, cpu, fast, slow, true
		l.Mem, l.MemValid, l.MemLimit, l.WorkingSet, l.Cores = mem, true, limit, uint64(mem*limit), 1.5
		for s := range l.Signals {
			st := &l.Signals[s]
			rule := info.Signals[s]
			req := uint64(perSignal * (1 + 0.1*rng.NormFloat64()))
			p := 0.0
			// An exempt signal's machine runs too; its rule admits everything.
			st.State = state
			if rule.Enabled {
				switch state {
				case decision.Shedding:
					p = rule.DropMin + (rule.DropMax-rule.DropMin)*pDrop
				case decision.Open:
					p = 1
				}
			}
			st.DropProbability = p
			denied := uint64(float64(req) * p)
			st.Allowed += req - denied
			if state == decision.Open {
				st.DeniedOpen += denied
			} else {
				st.DeniedShed += denied
			}
		}
		l.BudgetLimit = 24 << 20
		l.BudgetReserved = int64(float64(l.BudgetLimit) * math.Min(0.95, 0.15*load*load+0.02*rng.Float64()))
		ring.Record(l.Sample())
	}
	return ring, l
}

func inc(n int, hit bool) int {
	if hit {
		return n + 1
	}
	return 0
}
