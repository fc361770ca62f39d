// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// ClientsTimeline is one run of the client matrix (bench/clients), sampled
// on one time axis (seconds since the gateway started).
type ClientsTimeline struct {
	Title string
	T     []float64
	// State is the gateway's traces state (0 Normal, 1 Shedding, 2 Open).
	State []float64
	// MemoryPct and CPUSlowPct are the throttle's levels, CPUPct the
	// cgroup's CPU use, in % of the limit and quota; the lines in %.
	MemoryPct, CPUSlowPct, CPUPct        []float64
	MemEnter, MemHard, CPUEnter, CPUHard float64
	// Shed, Open and Budget are the throttle's cumulative refusals of
	// traces by reason.
	Shed, Open, Budget []float64
	// Stress: when the memory pulses or the CPU load ran; Load: the load
	// phase's start and end (NaN: not seen).
	Stress [][2]float64
	Load   [2]float64
	// Clients and Arrived: each client's cumulative distinct spans at the
	// sink.
	Clients []string
	Arrived [][]float64
}

// clientColors are the clients' line colours, in order.
var clientColors = []color.Color{
	cBlue, cOrange, cGreen, cRed, cPurple, cBrown,
	color.RGBA{227, 119, 194, 255},
	color.RGBA{23, 190, 207, 255},
	color.RGBA{188, 189, 34, 255},
	cGrey,
}

// Chart size of the client matrix: small enough to stay under 150 KB
// with ten clients' lines over a 10-minute run.
const (
	clientsChartW   = 10 * vg.Inch
	clientsChartH   = 8 * vg.Inch
	clientsChartDPI = 72
)

// WriteClientsTimeline draws the run as stacked panels (state and stress;
// levels; refusals per second by reason; arrivals per second per client)
// into a PNG at path.
func WriteClientsTimeline(path string, tl ClientsTimeline) error {
	img := vgimg.NewWith(vgimg.UseWH(clientsChartW, clientsChartH), vgimg.UseDPI(clientsChartDPI))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Path())
	stack(clientsPanels(tl), []float64{0.18, 0.27, 0.22, 0.33}, dc)
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&b); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func clientsPanels(tl ClientsTimeline) []*panel {
	x1 := 1.0
	if len(tl.T) > 0 {
		x1 = tl.T[len(tl.T)-1]
	}
	dash := []vg.Length{vg.Points(5), vg.Points(3)}

	// 1. State, and when the stress ran.
	st := newPanel(tl.Title, "state")
	for i, s := range tl.Stress {
		to := s[1]
		if math.IsNaN(to) {
			to = x1
		}
		name := ""
		if i == 0 {
			name = "stress (CPU load or memory pulse)"
		}
		addLine(st, name, []float64{s[0], s[0], to, to}, []float64{-0.2, 2.4, 2.4, -0.2}, lineOpt{color: cLight, width: vg.Points(1)})
	}
	addLine(st, "gateway's traces state", tl.T, tl.State, lineOpt{color: cRed, width: vg.Points(2), step: true})
	st.Y.Min, st.Y.Max = -0.3, 2.6
	st.Y.Tick.Marker = stateTicks{}

	// 2. Levels.
	lv := newPanel("throttle's levels (% of the memory limit, of the CPU quota)", "%")
	addLine(lv, "CPU used (cgroup)", tl.T, tl.CPUPct, lineOpt{color: cLight, width: vg.Points(0.8), clip: 150})
	addLine(lv, "memory level", tl.T, tl.MemoryPct, lineOpt{color: cBlue, width: vg.Points(1.8)})
	addLine(lv, "cpu_slow", tl.T, tl.CPUSlowPct, lineOpt{color: cOrange, width: vg.Points(1.5), clip: 150})
	hline(lv, fmt.Sprintf("memory enter %.0f / hard %.0f", tl.MemEnter, tl.MemHard), tl.MemEnter, x1, cBlue, dash)
	hline(lv, "", tl.MemHard, x1, cBlue, nil)
	hline(lv, fmt.Sprintf("cpu enter %.0f / hard %.0f", tl.CPUEnter, tl.CPUHard), tl.CPUEnter, x1, cOrange, dash)
	hline(lv, "", tl.CPUHard, x1, cOrange, nil)
	lv.Y.Min, lv.Y.Max = 0, 150
	lv.Y.Tick.Marker = countTicks{}

	// 3. Refusals.
	rf := newPanel("throttle's refusals of traces per second, by reason", "req/s")
	shed, open, budget := rate(tl.T, tl.Shed), rate(tl.T, tl.Open), rate(tl.T, tl.Budget)
	addLine(rf, "shed", tl.T, shed, lineOpt{color: cOrange, width: vg.Points(1.4)})
	addLine(rf, "open", tl.T, open, lineOpt{color: cRed, width: vg.Points(1.4)})
	addLine(rf, "budget", tl.T, budget, lineOpt{color: cPurple, width: vg.Points(1.4)})
	rf.Y.Min, rf.Y.Max = 0, math.Max(10, maxOf(shed, open, budget)*1.2)
	rf.Y.Tick.Marker = countTicks{}

	// 4. Arrivals per client.
	ar := newPanel(fmt.Sprintf("spans arriving at the sink per second, by client (over %.0f s)", arrivalWindow), "spans/s")
	var rates [][]float64
	for i, name := range tl.Clients {
		r := windowRate(tl.T, tl.Arrived[i], arrivalWindow)
		rates = append(rates, r)
		addLine(ar, name, tl.T, r, lineOpt{color: clientColors[i%len(clientColors)], width: vg.Points(1.2)})
	}
	ar.Y.Min, ar.Y.Max = 0, math.Max(10, maxOf(rates...)*1.15)
	ar.Y.Tick.Marker = countTicks{}
	ar.X.Label.Text = "seconds since the gateway started (the clients hand spans between the grey dashed lines)"
	ar.X.Label.TextStyle.Font.Size = vg.Points(11)

	ps := []*panel{st, lv, rf, ar}
	markEvents(ps, 0, x1, tl.Load[:], nil, nil)
	return ps
}

// arrivalWindow is the window of the arrival rates: a client exports a
// batch every second or two, so a shorter one shows the batches.
const arrivalWindow = 5.0

// windowRate turns a cumulative series into a per-second rate over the
// last window seconds (NaN where there is no value or no earlier sample).
func windowRate(t, c []float64, window float64) []float64 {
	out := make([]float64, len(c))
	j := 0
	for i := range c {
		out[i] = math.NaN()
		for j < i && t[i]-t[j] > window {
			j++
		}
		if j < i && !math.IsNaN(c[i]) && !math.IsNaN(c[j]) && t[i] > t[j] {
			out[i] = (c[i] - c[j]) / (t[i] - t[j])
		}
	}
	return out
}
