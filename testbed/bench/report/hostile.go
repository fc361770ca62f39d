// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/color/palette"
	imagedraw "image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// hostileRound is one round of a bench/hostile run's timeline.csv.
type hostileRound struct {
	Name string // "r02 fill-then-trickle"
	T    []float64
	// Per second: the normal clients' accepted spans and their requests by
	// class.
	Items, OK, Budget, Shed, Open, Refused, Errors []float64
	// The gateway: working set and CPU (% of its cgroup's limit and
	// quota), the admission budget reserved (% of the budget).
	WSPct, CPUPct, ReservedPct []float64
	// HostileOpen is the hostile peer's requests unanswered at each sample.
	HostileOpen []float64
	// LoadStart, LoadEnd bound the load phase (NaN when not seen).
	LoadStart, LoadEnd float64
	OOMAt              []float64
}

// loadHostileRounds splits timeline.csv by round and keeps the first
// round of each scenario (the capacity measurement left out), in order.
func loadHostileRounds(tl *Table) []*hostileRound {
	var order []string
	rows := map[string][]map[string]string{}
	seen := map[string]bool{}
	for _, r := range tl.Rows {
		sc := r["scenario"]
		if sc == "capacity" {
			continue
		}
		name := fmt.Sprintf("r%02d %s", int(Num(r["round"])), sc)
		if _, ok := rows[name]; !ok {
			if seen[sc] {
				continue
			}
			seen[sc] = true
			order = append(order, name)
		}
		rows[name] = append(rows[name], r)
	}
	var out []*hostileRound
	for _, name := range order {
		rs := rows[name]
		col := func(c string) []float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = Num(r[c])
			}
			return v
		}
		h := &hostileRound{Name: name, LoadStart: math.NaN(), LoadEnd: math.NaN()}
		h.T = col("t_s")
		h.Items, h.OK, h.Budget = rate(h.T, col("n_items")), rate(h.T, col("n_ok")), rate(h.T, col("n_budget"))
		h.Shed, h.Open, h.Refused, h.Errors = rate(h.T, col("n_shed")), rate(h.T, col("n_open")), rate(h.T, col("n_refused")), rate(h.T, col("n_error"))
		h.WSPct, h.CPUPct = col("ws_pct"), col("cpu_pct")
		reserved, limit := col("inflight_reserved"), col("inflight_limit")
		h.ReservedPct = make([]float64, len(rs))
		for i := range reserved {
			h.ReservedPct[i] = 100 * reserved[i] / limit[i] // NaN when either is missing
		}
		h.HostileOpen = col("h_open")
		oom := col("oom_kills")
		for i := 1; i < len(rs); i++ {
			if rs[i]["phase"] == "load" && rs[i-1]["phase"] != "load" {
				h.LoadStart = h.T[i]
			}
			if rs[i-1]["phase"] == "load" && rs[i]["phase"] != "load" {
				h.LoadEnd = h.T[i]
			}
			if oom[i] > oom[i-1] {
				h.OOMAt = append(h.OOMAt, h.T[i])
			}
		}
		out = append(out, h)
	}
	return out
}

// GenerateHostile reads dir/timeline.csv of a bench/hostile run and writes
// two charts into dir, one panel per scenario (its first round, the first
// baseline included): normal-clients.png, the normal clients' accepted
// spans/s and refusals per second by reason, and gateway.png, the
// gateway's working set, CPU and reserved admission budget with the
// hostile peer's unanswered requests. It returns their paths.
func GenerateHostile(dir string) ([]string, error) {
	tl, err := ReadCSV(filepath.Join(dir, "timeline.csv"))
	if err != nil {
		return nil, err
	}
	rounds := loadHostileRounds(tl)
	if len(rounds) == 0 {
		return nil, fmt.Errorf("%s: no round in timeline.csv", dir)
	}
	var files []string
	for _, c := range []struct {
		file   string
		panels func(*hostileRound) *panel
	}{
		{"normal-clients.png", normalPanel},
		{"gateway.png", gatewayPanel},
	} {
		var ps []*panel
		for _, r := range rounds {
			ps = append(ps, c.panels(r))
		}
		last := ps[len(ps)-1]
		last.X.Label.Text = "seconds since the round's gateway was ready (load phase, with the hostile peer, between the grey dashed lines)"
		last.X.Label.TextStyle.Font.Size = vg.Points(10)
		path := filepath.Join(dir, c.file)
		if err := writeStackPNG(ps, path); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}

func normalPanel(r *hostileRound) *panel {
	// Spans and requests share the axis: requests are scaled by a power
	// of ten to the spans' range.
	peak := maxOf(r.Items)
	reqScale := 1.0
	if m := maxOf(r.OK, r.Budget, r.Shed, r.Open, r.Refused, r.Errors); m > 0 && peak > 0 {
		reqScale = math.Max(1, math.Pow(10, math.Floor(math.Log10(peak/m))))
	}
	scaled := func(v []float64) []float64 {
		out := make([]float64, len(v))
		for i := range v {
			out[i] = v[i] * reqScale
		}
		return out
	}
	p := newPanel(fmt.Sprintf("%s: the normal clients' spans/s accepted, and their requests/s (x %.0f) refused by reason", r.Name, reqScale), "per s")
	addLine(p, "spans accepted", r.T, r.Items, lineOpt{color: cGreen, width: vg.Points(1.6)})
	addLine(p, "refused: budget", r.T, scaled(r.Budget), lineOpt{color: cPurple, width: vg.Points(1.6)})
	addLine(p, "refused: shed", r.T, scaled(r.Shed), lineOpt{color: cOrange, width: vg.Points(1.2)})
	addLine(p, "refused: open", r.T, scaled(r.Open), lineOpt{color: cRed, width: vg.Points(1.2)})
	addLine(p, "refused: other", r.T, scaled(r.Refused), lineOpt{color: cBlack, width: vg.Points(1.2)})
	addLine(p, "errors (timeout, not sent)", r.T, scaled(r.Errors), lineOpt{color: cGrey, width: vg.Points(1)})
	p.Y.Tick.Marker = countTicks{}
	p.Y.Min, p.Y.Max = 0, math.Max(10, maxOf(r.Items, scaled(r.Budget), scaled(r.Shed), scaled(r.Open), scaled(r.Refused), scaled(r.Errors))*1.15)
	markRound(p, r)
	return p
}

func gatewayPanel(r *hostileRound) *panel {
	p := newPanel(r.Name+": the gateway (% of its limits) and the hostile peer's unanswered requests", "% / requests")
	addLine(p, "CPU (% of quota)", r.T, r.CPUPct, lineOpt{color: cLight, width: vg.Points(0.8), clip: 200})
	addLine(p, "working set (% of limit)", r.T, r.WSPct, lineOpt{color: cBlue, width: vg.Points(1.8)})
	addLine(p, "budget reserved (% of budget)", r.T, r.ReservedPct, lineOpt{color: cPurple, width: vg.Points(1.4)})
	addLine(p, "hostile requests unanswered", r.T, r.HostileOpen, lineOpt{color: cRed, width: vg.Points(1.2), step: true})
	p.Y.Tick.Marker = countTicks{}
	p.Y.Min, p.Y.Max = 0, math.Max(110, math.Min(maxOf(r.WSPct, r.ReservedPct, r.HostileOpen)*1.1, 400))
	markRound(p, r)
	return p
}

// markRound sets a panel's time axis and marks the load phase and OOM
// kills.
func markRound(p *panel, r *hostileRound) {
	x1 := 1.0
	if len(r.T) > 0 {
		x1 = r.T[len(r.T)-1]
	}
	p.X.Min, p.X.Max = 0, x1
	p.X.Tick.Marker = secondTicks{}
	dash := []vg.Length{vg.Points(5), vg.Points(3)}
	for _, t := range []float64{r.LoadStart, r.LoadEnd} {
		if !math.IsNaN(t) {
			vlines(p, "", []float64{t}, p.Y.Min, p.Y.Max, cGrey, dash, vg.Points(1))
		}
	}
	if len(r.OOMAt) > 0 {
		vlines(p, fmt.Sprintf("OOM kill (%d)", len(r.OOMAt)), r.OOMAt, p.Y.Min, p.Y.Max, cRed, nil, vg.Points(1.5))
	}
}

// hostileDPI keeps a chart of seven panels well under 150 KB.
const hostileDPI = 80

func writeStackPNG(ps []*panel, path string) error {
	h := vg.Length(len(ps)) * 1.9 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(chartW, h), vgimg.UseDPI(hostileDPI))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Path())
	fr := make([]float64, len(ps))
	for i := range fr {
		fr[i] = 1 / float64(len(ps))
	}
	stack(ps, fr, dc)
	// A paletted PNG is a third of the size of the RGBA one and looks the
	// same: the charts have a few colours and their anti-aliasing.
	src := img.Image()
	pal := image.NewPaletted(src.Bounds(), palette.Plan9)
	imagedraw.Draw(pal, src.Bounds(), src, src.Bounds().Min, imagedraw.Src)
	var b bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&b, pal); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
