// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// FleetSeries is one scenario of a bench/fleet run's timeline.csv.
type FleetSeries struct {
	Scenario string
	T        []float64
	Phase    []string
	// The gateway: working set and CPU (% of limit and quota), throttle's
	// memory level (%) and state (NaN without throttle).
	WSPct, CPUPct, MemPct, State []float64
	// Spans per second: accepted by the agents, by the gateway, by the sink.
	AgentIn, GatewayIn, SinkIn []float64
	// HostPct is how busy the whole machine was, % of all its cores (NaN
	// in runs from before it was recorded).
	HostPct []float64
	// Queues in requests: the agents' summed, the gateway's exporter's.
	AgentQueue, GatewayQueue []float64
	// Cumulative spans the agents dropped: queue full, given up sending.
	AgentEnqueueFailed, AgentSendFailed []float64
	MemEnter, MemHard                   float64
	OOMAt, RestartAt                    []float64
	// BurstStart, BurstEnd: the load phase (NaN when not seen).
	BurstStart, BurstEnd float64
	// Capacity in spans/s, from summary.csv (NaN when unknown).
	Capacity float64
}

func loadFleetSeries(tl *Table) []*FleetSeries {
	var order []string
	rows := map[string][]map[string]string{}
	for _, r := range tl.Rows {
		s := r["scenario"]
		if _, ok := rows[s]; !ok {
			order = append(order, s)
		}
		rows[s] = append(rows[s], r)
	}
	var out []*FleetSeries
	for _, name := range order {
		rs := rows[name]
		s := &FleetSeries{
			Scenario: name, BurstStart: math.NaN(), BurstEnd: math.NaN(), Capacity: math.NaN(),
			MemEnter: math.NaN(), MemHard: math.NaN(),
		}
		col := func(c string, scale float64) []float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = Num(r[c]) * scale
			}
			return v
		}
		s.T = col("t_s", 1)
		for _, r := range rs {
			s.Phase = append(s.Phase, r["phase"])
		}
		s.WSPct, s.CPUPct, s.MemPct, s.State = col("gw_ws_pct", 1), col("gw_cpu_pct", 1), col("gw_wl_mem", 100), col("gw_state_traces", 1)
		s.HostPct = col("host_cpu_pct", 1)
		s.AgentIn = rate(s.T, col("ag_accepted_spans", 1))
		s.GatewayIn = rate(s.T, col("gw_accepted_spans", 1))
		s.SinkIn = rate(s.T, col("sink_accepted_spans", 1))
		s.AgentQueue, s.GatewayQueue = col("ag_queue_size", 1), col("gw_queue_size", 1)
		s.AgentEnqueueFailed, s.AgentSendFailed = col("ag_enqueue_failed_spans", 1), col("ag_send_failed_spans", 1)
		s.MemEnter, s.MemHard = last(col("gw_mem_enter", 100)), last(col("gw_mem_hard", 100))
		oom, restarts := col("gw_oom_kills", 1), col("gw_restarts", 1)
		for i := 1; i < len(rs); i++ {
			if oom[i] > oom[i-1] {
				s.OOMAt = append(s.OOMAt, s.T[i])
			}
			if restarts[i] > restarts[i-1] {
				s.RestartAt = append(s.RestartAt, s.T[i])
			}
			if s.Phase[i] != s.Phase[i-1] && s.Phase[i-1] == "load" {
				s.BurstEnd = s.T[i]
			}
		}
		out = append(out, s)
	}
	return out
}

// FleetFiles are the files GenerateFleet wrote.
type FleetFiles struct {
	Markdown string
	PNG      []string
}

// FleetCapacityFile is the fleet run's capacity measurement, step by step
// (markdown), which the report includes.
const FleetCapacityFile = "capacity.md"

// GenerateFleet reads dir/summary.csv and dir/timeline.csv of a bench/fleet
// run and writes report.md and timeline-<scenario>.png into dir.
func GenerateFleet(dir string) (FleetFiles, error) {
	var files FleetFiles
	sum, err := ReadCSV(filepath.Join(dir, "summary.csv"))
	if err != nil {
		return files, err
	}
	tl, err := ReadCSV(filepath.Join(dir, "timeline.csv"))
	if err != nil {
		return files, err
	}
	series := loadFleetSeries(tl)
	burst := math.NaN()
	for i := range sum.Rows {
		for _, s := range series {
			if s.Scenario == sum.Get(i, "scenario") {
				s.Capacity = Num(sum.Get(i, "capacity_spans_s"))
				burst = Num(sum.Get(i, "burst_s"))
			}
		}
	}
	for _, s := range series {
		if !math.IsNaN(s.BurstEnd) && !math.IsNaN(burst) {
			s.BurstStart = s.BurstEnd - burst
		}
		png := filepath.Join(dir, "timeline-"+safeName(s.Scenario)+".png")
		if err := writeFleetPNG(s, png); err != nil {
			return files, fmt.Errorf("chart %s: %w", s.Scenario, err)
		}
		files.PNG = append(files.PNG, png)
	}
	machine, _ := os.ReadFile(filepath.Join(dir, "machine.txt"))
	summaryMD, _ := os.ReadFile(filepath.Join(dir, "summary.md"))
	capacityMD, _ := os.ReadFile(filepath.Join(dir, FleetCapacityFile)) // absent when -capacity was given
	var md bytes.Buffer
	fmt.Fprintf(&md, "# Fleet benchmark\n\n```\n%s```\n\n%s\n%s", machine, summaryMD, capacityMD)
	if len(capacityMD) > 0 {
		md.WriteString("\n")
	}
	for _, p := range files.PNG {
		fmt.Fprintf(&md, "![%s](%s)\n\n", strings.TrimSuffix(filepath.Base(p), ".png"), filepath.Base(p))
	}
	files.Markdown = filepath.Join(dir, "report.md")
	return files, os.WriteFile(files.Markdown, md.Bytes(), 0o644)
}

// safeName makes a scenario name usable in a file name.
func safeName(s string) string {
	return strings.NewReplacer("+", "_", "/", "_", " ", "_").Replace(s)
}

func fleetPanels(s *FleetSeries) []*panel {
	x0, x1 := 0.0, 1.0
	if len(s.T) > 0 {
		x1 = s.T[len(s.T)-1]
	}
	dash := []vg.Length{vg.Points(5), vg.Points(3)}
	dot := []vg.Length{vg.Points(2), vg.Points(2)}
	throttled := !math.IsNaN(last(s.State))

	res := newPanel(s.Scenario+": the gateway's working set and CPU (% of its cgroup's limit and quota)", "% of limit / quota")
	yTop := math.Max(130, math.Min(maxOf(s.CPUPct, s.WSPct)*1.05, 200))
	addLine(res, "CPU (250 ms)", s.T, s.CPUPct, lineOpt{color: cLight, width: vg.Points(0.8), clip: yTop})
	addLine(res, "working set", s.T, s.WSPct, lineOpt{color: cBlue, width: vg.Points(2)})
	if maxOf(s.HostPct) > 0 { // recorded in this run
		addLine(res, "machine's CPU (all cores)", s.T, s.HostPct, lineOpt{color: cBrown, width: vg.Points(1)})
	}
	if throttled {
		addLine(res, "throttle's memory level", s.T, s.MemPct, lineOpt{color: cPurple, width: vg.Points(1.2)})
		hline(res, fmt.Sprintf("mem enter %.0f / hard %.0f", s.MemEnter, s.MemHard), s.MemEnter, x1, cPurple, dash)
		hline(res, "", s.MemHard, x1, cPurple, dot)
	}
	hline(res, "limit", 100, x1, cBlack, nil)
	res.Y.Tick.Marker = countTicks{}
	res.Y.Min, res.Y.Max = 0, yTop

	st := newPanel("throttle state (traces)", "state")
	if throttled {
		addLine(st, "traces", s.T, s.State, lineOpt{color: cRed, width: vg.Points(2), step: true})
	} else {
		st.Title.Text = "throttle state: no throttle in this scenario"
	}
	st.Y.Min, st.Y.Max = -0.3, 2.6
	st.Y.Tick.Marker = stateTicks{}

	flow := newPanel("spans per second accepted by the agents, the gateway and the sink", "spans/s")
	addLine(flow, "agents (offered)", s.T, s.AgentIn, lineOpt{color: cLight, width: vg.Points(1.2)})
	addLine(flow, "gateway (acknowledged)", s.T, s.GatewayIn, lineOpt{color: cOrange, width: vg.Points(1.2)})
	addLine(flow, "sink (delivered)", s.T, s.SinkIn, lineOpt{color: cGreen, width: vg.Points(2)})
	if !math.IsNaN(s.Capacity) {
		hline(flow, fmt.Sprintf("capacity %.0f", s.Capacity), s.Capacity, x1, cBlack, dash)
	}
	flow.Y.Tick.Marker = countTicks{}
	flow.Y.Min, flow.Y.Max = 0, math.Max(10, maxOf(s.AgentIn, s.GatewayIn, s.SinkIn)*1.15)

	q := newPanel("queued requests: the agents' sending queues (sum) and the gateway's exporter", "requests")
	addLine(q, "agents", s.T, s.AgentQueue, lineOpt{color: cBlue, width: vg.Points(1.6)})
	addLine(q, "gateway", s.T, s.GatewayQueue, lineOpt{color: cOrange, width: vg.Points(1.6)})
	q.Y.Tick.Marker = countTicks{}
	q.Y.Min, q.Y.Max = 0, math.Max(10, maxOf(s.AgentQueue, s.GatewayQueue)*1.15)

	lost := newPanel("spans the agents dropped (cumulative): queue full, or given up after retries", "spans")
	addLine(lost, "enqueue failed", s.T, s.AgentEnqueueFailed, lineOpt{color: cRed, width: vg.Points(1.6)})
	addLine(lost, "send failed", s.T, s.AgentSendFailed, lineOpt{color: cBlack, width: vg.Points(1.6)})
	lost.Y.Tick.Marker = countTicks{}
	lost.Y.Min, lost.Y.Max = 0, math.Max(10, maxOf(s.AgentEnqueueFailed, s.AgentSendFailed)*1.15)
	lost.X.Label.Text = "seconds since the gateway started (burst between the grey dashed lines)"
	lost.X.Label.TextStyle.Font.Size = vg.Points(11)

	ps := []*panel{res, st, flow, q, lost}
	markEvents(ps, x0, x1, []float64{s.BurstStart, s.BurstEnd}, s.OOMAt, s.RestartAt)
	return ps
}

func writeFleetPNG(s *FleetSeries, path string) error {
	return writeChart(path, func(c draw.Canvas) {
		stack(fleetPanels(s), []float64{0.26, 0.12, 0.24, 0.19, 0.19}, c)
	})
}

// stack lays panels out one above the other on c, each taking its fraction
// of the height, with their data areas aligned and legends on the right.
func stack(ps []*panel, fr []float64, c draw.Canvas) {
	top := c.Max.Y
	h := c.Max.Y - c.Min.Y
	rows := make([][]*plot.Plot, len(ps))
	for i := range ps {
		rows[i] = []*plot.Plot{ps[i].Plot}
	}
	legW := 3.1 * vg.Inch
	pc := c
	pc.Max.X -= legW
	tiles := draw.Tiles{Rows: len(ps), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(4), PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(8)}
	aligned := plot.Align(rows, tiles, pc)
	for i, p := range ps {
		cv := aligned[i][0]
		ph := vg.Length(fr[i]) * h
		cv.Max.Y = top - vg.Points(4)
		cv.Min.Y = top - ph + vg.Points(4)
		top -= ph
		p.Draw(cv)
		lc := cv
		lc.Min.X, lc.Max.X = pc.Max.X+vg.Points(2), c.Max.X-vg.Points(4)
		lc.Max.Y -= vg.Points(22)
		p.leg.Draw(lc)
	}
}
