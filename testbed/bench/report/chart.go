// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

var (
	cBlue   = color.RGBA{31, 119, 180, 255}
	cOrange = color.RGBA{255, 127, 14, 255}
	cGreen  = color.RGBA{44, 160, 44, 255}
	cRed    = color.RGBA{214, 39, 40, 255}
	cPurple = color.RGBA{148, 103, 189, 255}
	cBrown  = color.RGBA{140, 86, 75, 255}
	cGrey   = color.RGBA{150, 150, 150, 255}
	cLight  = color.RGBA{200, 200, 200, 255}
	cBlack  = color.RGBA{0, 0, 0, 255}
)

const (
	chartW = 13 * vg.Inch
	chartH = 11 * vg.Inch
	dpi    = 110
)

// segments splits x, y at NaN values of y into drawable runs.
func segments(x, y []float64) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for i := range y {
		if math.IsNaN(y[i]) || math.IsNaN(x[i]) || math.IsInf(y[i], 0) {
			if len(cur) > 0 {
				out = append(out, cur)
				cur = nil
			}
			continue
		}
		cur = append(cur, plotter.XY{X: x[i], Y: y[i]})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

type lineOpt struct {
	color  color.Color
	width  vg.Length
	dashes []vg.Length
	step   bool
	offset float64
	clip   float64 // values above are drawn at clip (0: none)
}

// panel is one stacked plot and its legend, drawn beside the plot rather
// than over its data.
type panel struct {
	*plot.Plot
	leg plot.Legend
}

// addLine draws one series (with gaps) and adds it to the legend once.
func addLine(p *panel, name string, x, y []float64, o lineOpt) {
	yy := make([]float64, len(y))
	for i, v := range y {
		yy[i] = v + o.offset
		if o.clip > 0 && yy[i] > o.clip {
			yy[i] = o.clip
		}
	}
	first := true
	for _, seg := range segments(x, yy) {
		l, err := plotter.NewLine(seg)
		if err != nil {
			continue
		}
		l.Color = o.color
		l.Width = o.width
		if l.Width == 0 {
			l.Width = vg.Points(1.2)
		}
		l.Dashes = o.dashes
		if o.step {
			l.StepStyle = plotter.PostStep
		}
		p.Add(l)
		if first && name != "" {
			p.leg.Add(name, l)
			first = false
		}
	}
}

// hline draws a horizontal threshold line across [0, x1]: the charts' time
// axes start at 0.
func hline(p *panel, name string, y, x1 float64, c color.Color, dashes []vg.Length) {
	if math.IsNaN(y) {
		return
	}
	addLine(p, name, []float64{0, x1}, []float64{y, y}, lineOpt{color: c, width: vg.Points(0.9), dashes: dashes})
}

// vlines marks events at times ts across [y0, y1].
func vlines(p *panel, name string, ts []float64, y0, y1 float64, c color.Color, dashes []vg.Length, w vg.Length) {
	for i, t := range ts {
		n := ""
		if i == 0 {
			n = name
		}
		addLine(p, n, []float64{t, t}, []float64{y0, y1}, lineOpt{color: c, width: w, dashes: dashes})
	}
}

// secondTicks: a major tick every 5 or 10 seconds, labelled in whole
// seconds.
type secondTicks struct{}

func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 5.0
	if hi-lo > 120 {
		step = 30
	} else if hi-lo > 60 {
		step = 10
	}
	var ts []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', 0, 64)})
	}
	return ts
}

// countTicks are the default ticks labelled without decimals.
type countTicks struct{}

func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', 0, 64)
		}
	}
	return ts
}

// stateTicks labels the state axis.
type stateTicks struct{}

func (stateTicks) Ticks(_, _ float64) []plot.Tick {
	return []plot.Tick{{Value: 0, Label: "Normal"}, {Value: 1, Label: "Shedding"}, {Value: 2, Label: "Open"}}
}

func maxOf(vs ...[]float64) float64 {
	m := 0.0
	for _, v := range vs {
		for _, x := range v {
			if !math.IsNaN(x) && !math.IsInf(x, 0) {
				m = math.Max(m, x)
			}
		}
	}
	return m
}

func newPanel(title, ylabel string) *panel {
	p := &panel{Plot: plot.New(), leg: plot.NewLegend()}
	p.leg.TextStyle.Font.Size = vg.Points(10)
	p.leg.Top, p.leg.Left = true, true
	p.leg.Padding = vg.Points(1.5)
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.Title.Padding = vg.Points(3)
	p.Y.Label.Text = ylabel
	p.Y.Label.TextStyle.Font.Size = vg.Points(11)
	p.Y.Tick.Label.Font.Size = vg.Points(10)
	p.X.Tick.Label.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	return p
}

// panels builds the stacked panels of one scenario, sharing the time axis.
func panels(s *Series) []*panel {
	x0, x1 := 0.0, 1.0
	if len(s.T) > 0 {
		x1 = s.T[len(s.T)-1]
	}
	dash := []vg.Length{vg.Points(5), vg.Points(3)}
	dot := []vg.Length{vg.Points(2), vg.Points(2)}
	throttled := !math.IsNaN(s.CPUHard)

	// 1. Resources.
	res := newPanel(fmt.Sprintf("Scenario %s: working set and CPU (%% of the cgroup's limit and quota)", s.Scenario), "% of limit / quota")
	yTop := math.Max(130, math.Min(maxOf(s.CPUPct, s.WSPct)*1.05, 200))
	addLine(res, "CPU (250 ms)", s.T, s.CPUPct, lineOpt{color: cLight, width: vg.Points(0.8), clip: yTop})
	addLine(res, "working set", s.T, s.WSPct, lineOpt{color: cBlue, width: vg.Points(2)})
	if throttled {
		addLine(res, "throttle cpu_slow", s.T, s.CPUSlowPct, lineOpt{color: cOrange, width: vg.Points(1.8), clip: yTop})
		addLine(res, "throttle cpu_fast", s.T, s.CPUFastPct, lineOpt{color: cRed, width: vg.Points(1), clip: yTop})
		hline(res, fmt.Sprintf("cpu enter %.0f / exit %.0f", s.CPUEnter, s.CPUExit), s.CPUEnter, x1, cOrange, dash)
		hline(res, "", s.CPUExit, x1, cOrange, dot)
		hline(res, fmt.Sprintf("cpu hard %.0f", s.CPUHard), s.CPUHard, x1, cRed, dash)
		hline(res, fmt.Sprintf("mem enter %.0f / hard %.0f", s.MemEnter, s.MemHard), s.MemEnter, x1, cBlue, dash)
		hline(res, "", s.MemHard, x1, cBlue, dot)
	}
	hline(res, "limit", 100, x1, cBlack, nil)
	res.Y.Tick.Marker = countTicks{}
	res.Y.Min, res.Y.Max = 0, yTop

	// 2. State.
	st := newPanel("throttle state per signal (metrics exempt: rejected only at and after the memory backstop)", "state")
	if throttled {
		addLine(st, "traces", s.T, s.StateTraces, lineOpt{color: cRed, width: vg.Points(2), step: true, offset: 0.06})
		addLine(st, "logs", s.T, s.StateLogs, lineOpt{color: cPurple, width: vg.Points(1.5), step: true})
		addLine(st, "metrics", s.T, s.StateMetrics, lineOpt{color: cGreen, width: vg.Points(1.5), step: true, offset: -0.06})
	} else {
		st.Title.Text = "throttle state per signal: no throttle in this scenario"
	}
	st.Y.Min, st.Y.Max = -0.3, 2.6
	st.Y.Tick.Marker = stateTicks{}

	// 3. Generator outcomes.
	gen := newPanel("requests per second seen by the load generator", "req/s")
	addLine(gen, "accepted (2xx)", s.T, s.OKps, lineOpt{color: cGreen, width: vg.Points(1.6)})
	addLine(gen, "rejected (429 / RESOURCE_EXHAUSTED)", s.T, s.Rejectedps, lineOpt{color: cRed, width: vg.Points(1.3)})
	addLine(gen, "failed (503, other, transport error)", s.T, s.Failedps, lineOpt{color: cBlack, width: vg.Points(1.3)})
	gen.Y.Tick.Marker = countTicks{}
	gen.Y.Min, gen.Y.Max = 0, math.Max(10, maxOf(s.OKps, s.Rejectedps, s.Failedps)*1.25)

	// 4. Throttle denials by reason.
	den := newPanel("throttle denials per second by reason (collector's counters)", "req/s")
	if throttled {
		addLine(den, "shed (drop probability)", s.T, s.Shedps, lineOpt{color: cOrange, width: vg.Points(1.5)})
		addLine(den, "open", s.T, s.Openps, lineOpt{color: cRed, width: vg.Points(1.5)})
		addLine(den, "budget (admission)", s.T, s.Budgetps, lineOpt{color: cPurple, width: vg.Points(1.5)})
	} else {
		den.Title.Text = "throttle denials: no throttle in this scenario"
	}
	den.Y.Tick.Marker = countTicks{}
	den.Y.Min, den.Y.Max = 0, math.Max(10, maxOf(s.Shedps, s.Openps, s.Budgetps)*1.25)
	den.X.Label.Text = "seconds since the collector started (load phase between the grey dashed lines)"
	den.X.Label.TextStyle.Font.Size = vg.Points(11)

	ps := []*panel{res, st, gen, den}
	markEvents(ps, x0, x1, []float64{s.LoadStart, s.LoadEnd}, s.OOMAt, s.RestartAt)
	return ps
}

// markEvents sets the shared time axis of ps and marks, across every
// panel, the phase bounds (grey dashes), OOM kills and restarts; the first
// panel's legend names the events and carries marks at its top, so that
// they read as events and not as data.
func markEvents(ps []*panel, x0, x1 float64, bounds, oomAt, restartAt []float64) {
	dash := []vg.Length{vg.Points(5), vg.Points(3)}
	dot := []vg.Length{vg.Points(2), vg.Points(2)}
	for i, p := range ps {
		p.X.Min, p.X.Max = x0, x1
		p.X.Tick.Marker = secondTicks{}
		for _, t := range bounds {
			if !math.IsNaN(t) {
				vlines(p, "", []float64{t}, p.Y.Min, p.Y.Max, cGrey, dash, vg.Points(1))
			}
		}
		name := ""
		if i == 0 {
			name = fmt.Sprintf("OOM kill (%d)", len(oomAt))
		}
		if len(oomAt) > 0 {
			vlines(p, name, oomAt, p.Y.Min, p.Y.Max, cRed, nil, vg.Points(1.5))
		}
		if i == 0 {
			name = fmt.Sprintf("restart (%d)", len(restartAt))
		}
		if len(restartAt) > 0 {
			vlines(p, name, restartAt, p.Y.Min, p.Y.Max, cBrown, dot, vg.Points(1.5))
		}
		if i == 0 {
			addMarks(p, oomAt, p.Y.Max*0.97, draw.CrossGlyph{}, cRed)
			addMarks(p, restartAt, p.Y.Max*0.93, draw.TriangleGlyph{}, cBrown)
		}
	}
}

func addMarks(p *panel, ts []float64, y float64, g draw.GlyphDrawer, c color.Color) {
	if len(ts) == 0 {
		return
	}
	pts := make(plotter.XYs, len(ts))
	for i, t := range ts {
		pts[i] = plotter.XY{X: t, Y: y}
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return
	}
	sc.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(4), Shape: g}
	p.Add(sc)
}

// drawPanels lays the panels out one above the other on c, with the
// resources panel taller.
func drawPanels(s *Series, c draw.Canvas) {
	// Heights: resources 34%, state 16%, generator 25%, denials 25%.
	stack(panels(s), []float64{0.34, 0.16, 0.25, 0.25}, c)
}

func writePNG(s *Series, path string) error {
	return writeChart(path, func(c draw.Canvas) { drawPanels(s, c) })
}

func renderSVG(s *Series) ([]byte, error) {
	c := vgsvg.New(chartW, chartH)
	dc := draw.New(c)
	drawPanels(s, dc)
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
