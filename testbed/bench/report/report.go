// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package report turns the CSVs of one bench/overload run (summary.csv and
// timeline.csv) into the overload benchmark's report: a Markdown table per scenario,
// a timeline chart per scenario (stacked panels on one shared time axis) as
// PNG and as an HTML page with the same charts in SVG, and the plotted
// series as CSV.
//
// It reads only the CSVs, so a report can be regenerated from a results
// folder at any time:
//
//	bin/overload -report bench/runs/<run>   # from the repository root
package report

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Table is the parsed summary.csv: its header and rows, by column name.
type Table struct {
	Header []string
	Rows   []map[string]string
}

// Get returns the value of column name in row i ("" when absent).
func (t *Table) Get(i int, name string) string { return t.Rows[i][name] }

// ReadCSV reads a CSV file with a header line.
func ReadCSV(path string) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	r.ReuseRecord = false
	header, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t := &Table{Header: header}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// A run killed mid-write leaves a partial last line: keep what
			// was read.
			break
		}
		row := make(map[string]string, len(header))
		for i, h := range header {
			if i < len(rec) {
				row[h] = rec[i]
			}
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

// Num parses a cell; an empty or bad cell is NaN (a gap, never 0).
func Num(s string) float64 {
	if s == "" {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return v
}

// Series is one scenario's timeline, derived from timeline.csv: levels as
// they are, cumulative counters turned into rates per second.
type Series struct {
	Scenario string
	T        []float64 // seconds since the scenario's collector started
	Phase    []string
	WSPct    []float64 // working set, % of the memory limit
	CPUPct   []float64 // CPU used over the last sample, % of the quota
	// The throttle's own view (scraped, 0..1 scaled to %), NaN without throttle.
	CPUSlowPct, CPUFastPct, MemPct []float64
	StateTraces, StateMetrics      []float64
	StateLogs                      []float64
	// Per second, from the generator's cumulative counters.
	OKps, Rejectedps, Failedps []float64
	// Per second, from the throttle's cumulative counters, by reason.
	Shedps, Openps, Budgetps []float64
	// Inflight budget reserved, MiB.
	InflightMiB []float64
	// Lines (last value seen; NaN when the scenario has no throttle).
	CPUEnter, CPUExit, CPUHard, MemEnter, MemExit, MemHard float64
	// Times of OOM kills and collector restarts.
	OOMAt, RestartAt []float64
	// Load phase bounds (NaN when not seen).
	LoadStart, LoadEnd float64
}

func last(v []float64) float64 {
	for i := len(v) - 1; i >= 0; i-- {
		if !math.IsNaN(v[i]) {
			return v[i]
		}
	}
	return math.NaN()
}

// rateWindow is the window of the per-second rates: the collector's
// counters are scraped asynchronously and advance in steps, so a rate over
// one 250 ms sample aliases into a 0 / double sawtooth.
const rateWindow = 1.0

// rate turns a cumulative column into a per-second rate over the last
// rateWindow seconds; a counter that goes down (a restarted collector) or
// a missing value gives a gap, and the window restarts after it.
func rate(t, c []float64) []float64 {
	out := make([]float64, len(c))
	start := -1 // first sample of the current unbroken run
	prev := math.NaN()
	for i, v := range c {
		out[i] = math.NaN()
		p := prev // c[i-1]
		prev = v
		if math.IsNaN(v) || math.IsNaN(t[i]) {
			start = -1
			continue
		}
		if start < 0 || v < p || math.IsNaN(p) {
			start = i
			continue
		}
		j := i - 1
		for j > start && t[i]-t[j] < rateWindow-1e-9 {
			j--
		}
		if t[i] > t[j] {
			out[i] = (c[i] - c[j]) / (t[i] - t[j])
		}
	}
	return out
}

// loadSeries splits timeline.csv by scenario, in order of appearance.
func loadSeries(tl *Table) []*Series {
	var order []string
	rows := map[string][]map[string]string{}
	for _, r := range tl.Rows {
		s := r["scenario"]
		if _, ok := rows[s]; !ok {
			order = append(order, s)
		}
		rows[s] = append(rows[s], r)
	}
	var out []*Series
	for _, name := range order {
		rs := rows[name]
		s := &Series{Scenario: name, LoadStart: math.NaN(), LoadEnd: math.NaN()}
		col := func(c string, scale float64) []float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = Num(r[c]) * scale
			}
			return v
		}
		s.T = col("t_s", 1)
		for i, r := range rs {
			s.Phase = append(s.Phase, r["phase"])
			if r["phase"] == "load" {
				if math.IsNaN(s.LoadStart) {
					s.LoadStart = s.T[i]
				}
				s.LoadEnd = s.T[i]
			}
		}
		s.WSPct, s.CPUPct = col("ws_pct", 1), col("cpu_pct", 1)
		s.CPUSlowPct, s.CPUFastPct, s.MemPct = col("wl_cpu_slow", 100), col("wl_cpu_fast", 100), col("wl_mem", 100)
		s.StateTraces, s.StateMetrics, s.StateLogs = col("state_traces", 1), col("state_metrics", 1), col("state_logs", 1)
		s.OKps = rate(s.T, col("lg_ok", 1))
		s.Rejectedps = rate(s.T, col("lg_rejected", 1))
		failed := col("lg_errors", 1)
		for i, v := range col("lg_unavailable", 1) {
			failed[i] += v
		}
		for i, v := range col("lg_other", 1) {
			failed[i] += v
		}
		s.Failedps = rate(s.T, failed)
		s.Shedps = rate(s.T, col("thr_denied_shed", 1))
		s.Openps = rate(s.T, col("thr_denied_open", 1))
		s.Budgetps = rate(s.T, col("thr_denied_budget", 1))
		s.InflightMiB = col("inflight_reserved", 1.0/(1<<20))
		s.CPUEnter, s.CPUExit, s.CPUHard = last(col("cpu_enter", 100)), last(col("cpu_exit", 100)), last(col("cpu_hard", 100))
		s.MemEnter, s.MemExit, s.MemHard = last(col("memory_enter", 100)), last(col("memory_exit", 100)), last(col("memory_hard", 100))
		oom, restarts := col("oom_kills", 1), col("restarts", 1)
		po, pr := math.NaN(), math.NaN()
		for i := range s.T {
			if !math.IsNaN(oom[i]) {
				if !math.IsNaN(po) && oom[i] > po {
					for range int(oom[i] - po) {
						s.OOMAt = append(s.OOMAt, s.T[i])
					}
				}
				po = oom[i]
			}
			if !math.IsNaN(restarts[i]) {
				if !math.IsNaN(pr) && restarts[i] > pr {
					s.RestartAt = append(s.RestartAt, s.T[i])
				}
				pr = restarts[i]
			}
		}
		out = append(out, s)
	}
	return out
}

// Files are the files Generate wrote.
type Files struct {
	Markdown, HTML, CSV string
	PNG                 []string
}

// Generate reads dir/summary.csv and dir/timeline.csv and writes into dir:
// report.md, report.html, timeline-<scenario>.png and chart.csv.
func Generate(dir string) (Files, error) {
	var files Files
	sum, err := ReadCSV(filepath.Join(dir, "summary.csv"))
	if err != nil {
		return files, err
	}
	tl, err := ReadCSV(filepath.Join(dir, "timeline.csv"))
	if err != nil {
		return files, err
	}
	series := loadSeries(tl)
	machine, _ := os.ReadFile(filepath.Join(dir, "machine.txt"))

	var svgs []svgChart
	for _, s := range series {
		if s.Scenario == "SAT" {
			continue
		}
		png := filepath.Join(dir, "timeline-"+s.Scenario+".png")
		if err := writePNG(s, png); err != nil {
			return files, fmt.Errorf("chart %s: %w", s.Scenario, err)
		}
		files.PNG = append(files.PNG, png)
		svg, err := renderSVG(s)
		if err != nil {
			return files, fmt.Errorf("chart %s: %w", s.Scenario, err)
		}
		svgs = append(svgs, svgChart{s.Scenario, svg})
	}
	files.CSV = filepath.Join(dir, "chart.csv")
	if err := writeChartCSV(series, files.CSV); err != nil {
		return files, err
	}
	extra, _ := os.ReadFile(filepath.Join(dir, ExtraFile)) // absent in most runs
	var md bytes.Buffer
	writeMarkdown(&md, sum, files, string(machine), string(extra))
	files.Markdown = filepath.Join(dir, "report.md")
	if err := os.WriteFile(files.Markdown, md.Bytes(), 0o644); err != nil {
		return files, err
	}
	files.HTML = filepath.Join(dir, "report.html")
	var h bytes.Buffer
	writeHTML(&h, sum, svgs, string(machine))
	if err := os.WriteFile(files.HTML, h.Bytes(), 0o644); err != nil {
		return files, err
	}
	return files, nil
}

// column is one column of the report's table.
type column struct {
	title string
	cell  func(t *Table, i int) string
}

func cellF(name string, prec int) func(t *Table, i int) string {
	return func(t *Table, i int) string {
		v := Num(t.Get(i, name))
		if math.IsNaN(v) {
			return "n/a"
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
}

func scenarioName(t *Table, i int) string {
	n := t.Get(i, "scenario")
	switch {
	case t.Get(i, "throttle") == "true":
		return n + " (throttle)"
	case t.Get(i, "memory_limiter") == "true":
		return n + " (memory_limiter)"
	}
	return n + " (off)"
}

var columns = []column{
	{"scenario", scenarioName},
	{"load", func(t *Table, i int) string { return t.Get(i, "load") }},
	{"goodput items/s", cellF("goodput_items_s", 0)},
	{"ok req/s", cellF("ok_req_s", 1)},
	{"requests rejected (429/RE)", cellF("rejected_429", 0)},
	{"failed (503, other, transport)", func(t *Table, i int) string {
		v := Num(t.Get(i, "unavailable_503")) + Num(t.Get(i, "other")) + Num(t.Get(i, "errors"))
		return strconv.FormatFloat(v, 'f', 0, 64)
	}},
	{"OOM kills", cellF("oom_kills", 0)},
	{"restarts", cellF("restarts", 0)},
	{"peak WS % of limit", cellF("peak_ws_pct", 1)},
	{"CPU % of quota mean", cellF("mean_cpu_pct", 0)},
	{"CPU % of quota peak", cellF("peak_cpu_pct", 0)},
	{"p99 ok ms", cellF("p99_ms", 0)},
	{"CPU s / M accepted items", cellF("cpu_s_per_m_items", 3)},
	{"exempt metrics lost", func(t *Table, i int) string {
		return t.Get(i, "metrics_lost") + " of " + t.Get(i, "metrics_sent")
	}},
	{"load avg (1 min) start / end", func(t *Table, i int) string {
		a, b := t.Get(i, "loadavg_start"), t.Get(i, "loadavg_end")
		if a == "" && b == "" {
			return "n/a"
		}
		return a + " / " + b
	}},
}

// MarkdownTable writes the table of summary rows.
func MarkdownTable(w io.Writer, t *Table) {
	var titles, seps []string
	for _, c := range columns {
		titles = append(titles, c.title)
		seps = append(seps, "---")
	}
	fmt.Fprintf(w, "| %s |\n|%s|\n", strings.Join(titles, " | "), strings.Join(seps, "|"))
	for i := range t.Rows {
		var cells []string
		for _, c := range columns {
			cells = append(cells, c.cell(t, i))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
}

// ExtraFile is Markdown a harness adds to its run's report below the table:
// the medians of -repeat rounds, the soak's trends.
const ExtraFile = "extra.md"

func writeMarkdown(w io.Writer, t *Table, files Files, machine, extra string) {
	fmt.Fprintf(w, "# Overload run\n\n")
	if machine != "" {
		fmt.Fprintf(w, "```\n%s```\n\n", machine)
	}
	MarkdownTable(w, t)
	fmt.Fprintf(w, "\nGoodput is accepted items per second over the load phase; p99 is of successful requests; "+
		"CPU s / M accepted items is the cgroup's CPU time over the load phase divided by the items accepted in it. "+
		"Load average is the machine's (the generator and anything else running share its cores).\n\n")
	if extra != "" {
		fmt.Fprintf(w, "%s\n\n", strings.TrimSpace(extra))
	}
	for _, p := range files.PNG {
		fmt.Fprintf(w, "![%s](%s)\n\n", filepath.Base(p), filepath.Base(p))
	}
	fmt.Fprintf(w, "The run's folder also holds `report.html` (the charts in SVG), `chart.csv` (the plotted series) and "+
		"`timeline.csv` (every sample); a baseline in bench/results keeps this report, `summary.csv` and at most three charts.\n")
}

type svgChart struct {
	scenario string
	svg      []byte
}

func writeHTML(w *bytes.Buffer, t *Table, charts []svgChart, machine string) {
	fmt.Fprint(w, `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>throttle overload run</title>
<style>body{font-family:sans-serif;margin:1em 2em}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #bbb;padding:3px 6px;text-align:right}th{background:#eee}td:first-child,td:nth-child(2){text-align:left}
pre{background:#f6f6f6;padding:.5em}svg{max-width:100%;height:auto}</style></head><body>
<h1>throttle overload run</h1>
`)
	if machine != "" {
		fmt.Fprintf(w, "<pre>%s</pre>\n", html.EscapeString(machine))
	}
	fmt.Fprint(w, "<table><tr>")
	for _, c := range columns {
		fmt.Fprintf(w, "<th>%s</th>", html.EscapeString(c.title))
	}
	fmt.Fprint(w, "</tr>\n")
	for i := range t.Rows {
		fmt.Fprint(w, "<tr>")
		for _, c := range columns {
			fmt.Fprintf(w, "<td>%s</td>", html.EscapeString(c.cell(t, i)))
		}
		fmt.Fprint(w, "</tr>\n")
	}
	fmt.Fprint(w, "</table>\n")
	for _, c := range charts {
		fmt.Fprintf(w, "<h2>Scenario %s</h2>\n<div>", html.EscapeString(c.scenario))
		svg := c.svg
		// Drop the XML prolog: the SVG is inlined in HTML.
		if i := bytes.Index(svg, []byte("<svg")); i > 0 {
			svg = svg[i:]
		}
		w.Write(svg)
		fmt.Fprint(w, "</div>\n")
	}
	fmt.Fprint(w, "</body></html>\n")
}

// chartHeader is the header of chart.csv: exactly the plotted series.
var chartHeader = []string{
	"scenario", "t_s", "phase", "ws_pct", "cpu_pct", "cpu_slow_pct", "cpu_fast_pct",
	"state_traces", "state_metrics", "state_logs", "ok_req_s", "rejected_req_s", "failed_req_s",
	"denied_shed_s", "denied_open_s", "denied_budget_s", "inflight_mib", "oom_kill", "restart",
}

func writeChartCSV(series []*Series, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(chartHeader)
	ff := func(v float64, prec int) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	count := func(at []float64, t float64) string {
		n := 0
		for _, x := range at {
			if x == t {
				n++
			}
		}
		return strconv.Itoa(n)
	}
	for _, s := range series {
		for i := range s.T {
			_ = w.Write([]string{
				s.Scenario, ff(s.T[i], 3), s.Phase[i], ff(s.WSPct[i], 2), ff(s.CPUPct[i], 1),
				ff(s.CPUSlowPct[i], 1), ff(s.CPUFastPct[i], 1),
				ff(s.StateTraces[i], 0), ff(s.StateMetrics[i], 0), ff(s.StateLogs[i], 0),
				ff(s.OKps[i], 1), ff(s.Rejectedps[i], 1), ff(s.Failedps[i], 1),
				ff(s.Shedps[i], 1), ff(s.Openps[i], 1), ff(s.Budgetps[i], 1), ff(s.InflightMiB[i], 2),
				count(s.OOMAt, s.T[i]), count(s.RestartAt, s.T[i]),
			})
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Scenarios returns the scenario names of a timeline, sorted (for tests).
func Scenarios(series []*Series) []string {
	var out []string
	for _, s := range series {
		out = append(out, s.Scenario)
	}
	sort.Strings(out)
	return out
}
