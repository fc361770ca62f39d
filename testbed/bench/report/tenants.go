// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot/vg"
)

// TenantsChart reads dir/timeline.csv of a bench/tenants run and writes
// file into dir: one panel per named round, the spans/s the sink received
// of each tenant (the noisy one, named noisy, in red; the quiet ones in
// blue, with their sum). It returns the chart's path.
func TenantsChart(dir, file string, rounds []string, noisy string) (string, error) {
	tl, err := ReadCSV(filepath.Join(dir, "timeline.csv"))
	if err != nil {
		return "", err
	}
	var tenants []string
	for _, h := range tl.Header {
		if t, ok := strings.CutPrefix(h, "sink_"); ok {
			tenants = append(tenants, t)
		}
	}
	var ps []*panel
	for _, name := range rounds {
		var rows []map[string]string
		for _, r := range tl.Rows {
			if r["round"] == name {
				rows = append(rows, r)
			}
		}
		if len(rows) > 0 {
			ps = append(ps, tenantsPanel(name, rows, tenants, noisy))
		}
	}
	if len(ps) == 0 {
		return "", fmt.Errorf("%s: none of the rounds %v in timeline.csv", dir, rounds)
	}
	last := ps[len(ps)-1]
	last.X.Label.Text = "seconds since the round started (the load window between the grey dashed lines)"
	last.X.Label.TextStyle.Font.Size = vg.Points(10)
	path := filepath.Join(dir, file)
	return path, writeStackPNG(ps, path)
}

func tenantsPanel(name string, rows []map[string]string, tenants []string, noisy string) *panel {
	col := func(c string) []float64 {
		v := make([]float64, len(rows))
		for i, r := range rows {
			v[i] = Num(r[c])
		}
		return v
	}
	t := col("t_s")
	p := newPanel(name+": spans/s delivered per tenant", "spans/s")
	quiet := make([]float64, len(t))
	var peak float64
	first := true
	for _, tn := range tenants {
		r := rate(t, col("sink_"+tn))
		if allNaN(r) {
			continue
		}
		peak = math.Max(peak, maxOf(r))
		if tn == noisy {
			addLine(p, tn+" (noisy)", t, r, lineOpt{color: cRed, width: vg.Points(1.8)})
			continue
		}
		for i, v := range r {
			quiet[i] += v // NaN where any is missing: a gap
		}
		label := ""
		if first {
			label, first = "each quiet tenant", false
		}
		addLine(p, label, t, r, lineOpt{color: cBlue, width: vg.Points(0.7)})
	}
	if !first {
		addLine(p, "the quiet tenants together", t, quiet, lineOpt{color: cGreen, width: vg.Points(1.6)})
		peak = math.Max(peak, maxOf(quiet))
	}
	p.Y.Tick.Marker = countTicks{}
	p.Y.Min, p.Y.Max = 0, math.Max(10, peak*1.15)
	p.X.Min, p.X.Max = 0, math.Max(1, maxOf(t))
	p.X.Tick.Marker = secondTicks{}
	// The load window's bounds: where the phase turns to and from "load".
	dash := []vg.Length{vg.Points(5), vg.Points(3)}
	for i := 1; i < len(rows); i++ {
		if (rows[i]["phase"] == "load") != (rows[i-1]["phase"] == "load") {
			vlines(p, "", []float64{t[i]}, p.Y.Min, p.Y.Max, cGrey, dash, vg.Points(1))
		}
	}
	return p
}

func allNaN(v []float64) bool {
	for _, x := range v {
		if !math.IsNaN(x) {
			return false
		}
	}
	return true
}
