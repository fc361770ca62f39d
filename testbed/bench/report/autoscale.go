// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// AutoscaleRun is one run of the autoscaling replay (bench/fleet -tier N
// -autoscale), for its charts; times are seconds from the load's start.
type AutoscaleRun struct {
	Round int
	// Signal is what the HPA scaled on: "cpu" or "demand".
	Signal string
	// ReadyT, Ready: the replicas in the balancer's rotation, from the
	// load's start, one point per change.
	ReadyT, Ready []float64
	// SyncT, Ratio: the signal's average over its target at each HPA sync
	// (NaN: no pod counted).
	SyncT, Ratio []float64
	// SinkT, Sink: the sink's rate, spans/s.
	SinkT, Sink []float64
}

// AutoscaleCharts is what the replay's three charts show, one panel per
// scenario in each.
type AutoscaleCharts struct {
	// Scenarios name the panels; Runs are each scenario's runs.
	Scenarios []string
	Runs      [][]AutoscaleRun
	// LoadEnd is when the load ended; Offered its rate, spans/s.
	LoadEnd, Offered float64
	// Needed is the replicas the load needs, Max the most the HPA may set.
	Needed, Max int
	// Tolerance is the HPA's: it scales when the ratio is beyond 1 ± it.
	Tolerance float64
}

// The replay's charts, in the order WriteAutoscaleCharts writes them.
const (
	AutoscaleReplicasChart = "replicas.png"
	AutoscaleMetricChart   = "metric.png"
	AutoscaleSinkChart     = "sink.png"
)

// WriteAutoscaleCharts writes the replay's charts into dir: the ready
// replicas over time, each signal's ratio to its target at each sync, and
// the sink's rate, every run of a scenario in one panel (colour: the
// signal; dashes: the round). It returns their paths.
func WriteAutoscaleCharts(dir string, c AutoscaleCharts) ([]string, error) {
	var files []string
	for _, ch := range []struct {
		file  string
		panel func(c AutoscaleCharts, i int) *panel
	}{
		{AutoscaleReplicasChart, replicasPanel},
		{AutoscaleMetricChart, ratioPanel},
		{AutoscaleSinkChart, sinkPanel},
	} {
		var ps []*panel
		for i := range c.Scenarios {
			ps = append(ps, ch.panel(c, i))
		}
		if len(ps) == 0 {
			return files, fmt.Errorf("%s: no scenario to chart", dir)
		}
		last := ps[len(ps)-1]
		last.X.Label.Text = "seconds from the load's start (the load ends at the grey dashed line)"
		last.X.Label.TextStyle.Font.Size = vg.Points(10)
		fr := make([]float64, len(ps))
		for i := range fr {
			fr[i] = 1 / float64(len(ps))
		}
		path := filepath.Join(dir, ch.file)
		h := vg.Length(len(ps))*3.6*vg.Inch + 0.4*vg.Inch
		if err := writeChartSized(path, chartW, h, func(dc draw.Canvas) { stack(ps, fr, dc) }); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}

// signalStyle: the colour of a signal's runs and the dashes of a round's.
func signalStyle(r AutoscaleRun) lineOpt {
	o := lineOpt{color: cBlue, width: vg.Points(1.8)}
	if r.Signal == "cpu" {
		o.color = cOrange
	}
	switch r.Round % 3 {
	case 2:
		o.dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	case 0:
		o.dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	}
	return o
}

func runName(r AutoscaleRun) string { return fmt.Sprintf("HPA on %s, round %d", r.Signal, r.Round) }

// xEnd is the end of a panel's time axis: the last point of its runs.
func xEnd(c AutoscaleCharts, runs []AutoscaleRun) float64 {
	x := c.LoadEnd
	for _, r := range runs {
		for _, v := range [][]float64{r.ReadyT, r.SyncT, r.SinkT} {
			if len(v) > 0 {
				x = math.Max(x, v[len(v)-1])
			}
		}
	}
	return x
}

func markLoad(p *panel, c AutoscaleCharts, x1 float64) {
	p.X.Min, p.X.Max = 0, x1
	p.X.Tick.Marker = secondTicks{}
	vlines(p, "", []float64{c.LoadEnd}, p.Y.Min, p.Y.Max, cGrey, []vg.Length{vg.Points(5), vg.Points(3)}, vg.Points(1))
}

func replicasPanel(c AutoscaleCharts, i int) *panel {
	runs := c.Runs[i]
	x1 := xEnd(c, runs)
	p := newPanel(fmt.Sprintf("%s: replicas ready (in the balancer's rotation); %d needed", c.Scenarios[i], c.Needed), "replicas")
	for j, r := range runs {
		// Extended to the axis' end, and offset a little per run so that
		// equal steps stay apart.
		t, n := append([]float64{}, r.ReadyT...), append([]float64{}, r.Ready...)
		if len(n) > 0 {
			t, n = append(t, x1), append(n, n[len(n)-1])
		}
		o := signalStyle(r)
		o.step, o.offset = true, 0.04*float64(j)-0.02*float64(len(runs)-1)
		addLine(p, runName(r), t, n, o)
	}
	hline(p, fmt.Sprintf("needed: %d", c.Needed), float64(c.Needed), x1, cBlack, []vg.Length{vg.Points(2), vg.Points(2)})
	p.Y.Min, p.Y.Max = 0, float64(c.Max)+0.5
	p.Y.Tick.Marker = countTicks{}
	markLoad(p, c, x1)
	return p
}

func ratioPanel(c AutoscaleCharts, i int) *panel {
	runs := c.Runs[i]
	x1 := xEnd(c, runs)
	p := newPanel(c.Scenarios[i]+": the signal the HPA read at each sync, over its target", "metric / target")
	top := 1.0 + c.Tolerance
	for _, r := range runs {
		o := signalStyle(r)
		addLine(p, runName(r), r.SyncT, r.Ratio, o)
		addDots(p, r.SyncT, r.Ratio, o.color)
		top = math.Max(top, maxOf(r.Ratio))
	}
	hline(p, "1 (the target)", 1, x1, cBlack, nil)
	hline(p, fmt.Sprintf("1 ± %g: no change within", c.Tolerance), 1+c.Tolerance, x1, cGrey, []vg.Length{vg.Points(2), vg.Points(2)})
	hline(p, "", 1-c.Tolerance, x1, cGrey, []vg.Length{vg.Points(2), vg.Points(2)})
	p.Y.Min, p.Y.Max = 0, top*1.1
	markLoad(p, c, x1)
	return p
}

func sinkPanel(c AutoscaleCharts, i int) *panel {
	runs := c.Runs[i]
	x1 := xEnd(c, runs)
	p := newPanel(c.Scenarios[i]+": spans/s reaching the sink", "spans/s")
	top := c.Offered
	for _, r := range runs {
		o := signalStyle(r)
		o.width = vg.Points(1.3)
		addLine(p, runName(r), r.SinkT, r.Sink, o)
		top = math.Max(top, maxOf(r.Sink))
	}
	hline(p, fmt.Sprintf("offered: %.0f", c.Offered), c.Offered, x1, cBlack, []vg.Length{vg.Points(5), vg.Points(3)})
	p.Y.Min, p.Y.Max = 0, top*1.1
	p.Y.Tick.Marker = countTicks{}
	markLoad(p, c, x1)
	return p
}

// addDots draws a dot at each drawable point of x, y.
func addDots(p *panel, x, y []float64, c color.Color) {
	var pts plotter.XYs
	for i := range y {
		if !math.IsNaN(y[i]) && !math.IsInf(y[i], 0) && !math.IsNaN(x[i]) {
			pts = append(pts, plotter.XY{X: x[i], Y: y[i]})
		}
	}
	if len(pts) == 0 {
		return
	}
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return
	}
	sc.GlyphStyle = draw.GlyphStyle{Color: c, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}
	p.Add(sc)
}
