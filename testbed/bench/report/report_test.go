// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"encoding/csv"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeRun writes a small run: A without throttle, D with throttle that
// goes Normal -> Shedding -> Open -> Shedding, a collector restart and an
// OOM kill in A, and a gap (collector down) in A's scraped values.
func writeRun(t *testing.T, dir string) {
	t.Helper()
	sum := "scenario,throttle,memory_limiter,load,seconds,sent,ok,rejected_429,unavailable_503,other,errors,skipped,accepted_items,goodput_items_s,ok_req_s,p50_ms,p99_ms,oom_kills,restarts,peak_ws_pct,mean_cpu_pct,peak_cpu_pct,cpu_s,cpu_s_per_m_items,metrics_sent,metrics_ok,metrics_lost,max_state_traces,max_state_metrics,generator_cores,loadavg_start,loadavg_end\n" +
		"A,false,false,closed c=8,60.0,100,90,0,0,0,10,0,45000,750,1.5,3.0,44.2,1,1,100.0,99.0,117.0,50.0,1.649,10,9,1,-1,-1,0.2,1.10,2.30\n" +
		"D,true,false,\"open 2400 req/s, max 512 in flight\",60.0,200,80,120,0,0,0,5,40000,666,1.3,175.0,732.4,0,0,60.8,84.0,203.0,50.1,2.019,20,20,0,2,2,0.3,2.30,2.50\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "summary.csv"), []byte(sum), 0o644))
	f, err := os.Create(filepath.Join(dir, "timeline.csv"))
	require.NoError(t, err)
	w := csv.NewWriter(f)
	header := []string{
		"scenario", "t_s", "phase", "restarts", "oom_kills", "ws_pct", "cpu_pct", "state_traces", "state_metrics", "state_logs",
		"wl_cpu_slow", "wl_cpu_fast", "wl_mem", "cpu_enter", "cpu_exit", "cpu_hard", "memory_enter", "memory_exit", "memory_hard",
		"thr_denied_shed", "thr_denied_open", "thr_denied_budget", "inflight_reserved", "lg_ok", "lg_rejected", "lg_unavailable", "lg_other", "lg_errors",
	}
	require.NoError(t, w.Write(header))
	for _, sc := range []string{"A", "D"} {
		for i := range 40 {
			ts := float64(i) * 0.25
			phase := "warmup"
			if i >= 8 {
				phase = "load"
			}
			row := map[string]string{
				"scenario": sc, "t_s": strconv.FormatFloat(ts, 'f', 3, 64), "phase": phase,
				"restarts": "0", "oom_kills": "0", "ws_pct": strconv.Itoa(10 + i), "cpu_pct": strconv.Itoa(50 + i),
				"lg_ok": strconv.Itoa(10 * i), "lg_rejected": strconv.Itoa(5 * i), "lg_unavailable": "0", "lg_other": "0", "lg_errors": "0",
			}
			if sc == "A" && i >= 20 {
				row["oom_kills"], row["restarts"] = "1", "1"
			}
			if sc == "A" && i == 19 {
				row["ws_pct"] = "" // collector down: a gap
			}
			if sc == "D" {
				state := "0"
				switch {
				case i >= 30:
					state = "1"
				case i >= 20:
					state = "2"
				case i >= 10:
					state = "1"
				}
				for k, v := range map[string]string{
					"state_traces": state, "state_metrics": state, "state_logs": state,
					"wl_cpu_slow": "0.8", "wl_cpu_fast": "0.9", "wl_mem": "0.3", "cpu_enter": "0.8", "cpu_exit": "0.7", "cpu_hard": "0.9",
					"memory_enter": "0.85", "memory_exit": "0.78", "memory_hard": "0.92", "thr_denied_shed": strconv.Itoa(2 * i),
					"thr_denied_open": strconv.Itoa(3 * i), "thr_denied_budget": "0", "inflight_reserved": "1048576",
				} {
					row[k] = v
				}
			}
			rec := make([]string, len(header))
			for j, h := range header {
				rec[j] = row[h]
			}
			require.NoError(t, w.Write(rec))
		}
	}
	w.Flush()
	require.NoError(t, w.Error())
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "machine.txt"), []byte("cpus 2\n"), 0o644))
}

func TestGenerate(t *testing.T) {
	dir := t.TempDir()
	writeRun(t, dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ExtraFile), []byte("\nMedians over the rounds:\n\n| scenario | rounds |\n|---|---|\n| D | 2 |\n"), 0o644))
	files, err := Generate(dir)
	require.NoError(t, err)

	md, err := os.ReadFile(files.Markdown)
	require.NoError(t, err)
	assert.Contains(t, string(md), "in it. Load average is the machine's (the generator and anything else running share its cores).\n\n"+
		"Medians over the rounds:\n\n| scenario | rounds |\n|---|---|\n| D | 2 |\n\n![timeline-A.png]", "the harness's extra figures below the table")
	assert.Contains(t, string(md), "| A (off) | closed c=8 | 750 | 1.5 | 0 | 10 | 1 | 1 | 100.0 | 99 | 117 | 44 | 1.649 | 1 of 10 | 1.10 / 2.30 |")
	assert.Contains(t, string(md), "| D (throttle) | open 2400 req/s, max 512 in flight | 666 |")
	assert.Contains(t, string(md), "![timeline-D.png](timeline-D.png)")
	assert.Contains(t, string(md), "cpus 2")

	require.Len(t, files.PNG, 2)
	for _, p := range files.PNG {
		f, err := os.Open(p)
		require.NoError(t, err)
		img, err := png.Decode(f)
		f.Close()
		require.NoError(t, err, p)
		assert.Greater(t, img.Bounds().Dx(), 1000)
	}
	h, err := os.ReadFile(files.HTML)
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(string(h), "<svg"), "one inline SVG per scenario")
	assert.NotContains(t, string(h), "<?xml")
	assert.Contains(t, string(h), "<td>D (throttle)</td>")

	c, err := os.ReadFile(files.CSV)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(c)), "\n")
	assert.Len(t, lines, 1+80)
	assert.Equal(t, strings.Join(chartHeader, ","), lines[0])
}

func TestLoadSeries(t *testing.T) {
	dir := t.TempDir()
	writeRun(t, dir)
	tl, err := ReadCSV(filepath.Join(dir, "timeline.csv"))
	require.NoError(t, err)
	series := loadSeries(tl)
	require.Equal(t, []string{"A", "D"}, Scenarios(series))
	a, d := series[0], series[1]
	assert.Equal(t, []float64{5}, a.OOMAt)
	assert.Equal(t, []float64{5}, a.RestartAt)
	assert.True(t, math.IsNaN(a.WSPct[19]), "an empty cell is a gap")
	assert.True(t, math.IsNaN(a.CPUHard), "no throttle, no lines")
	assert.Equal(t, 2.0, a.LoadStart)
	assert.InDelta(t, 40.0, a.OKps[5], 1e-9) // 10 per 0.25 s
	assert.InDelta(t, 12.0, d.Openps[5], 1e-9)
	assert.InDelta(t, 40.0, a.OKps[1], 1e-9, "a shorter window at the start")
	assert.Equal(t, 90.0, d.CPUHard)
	assert.Equal(t, 2.0, d.StateTraces[25])
	assert.Len(t, segments(a.T, a.WSPct), 2)
}

func TestRateGapOnReset(t *testing.T) {
	r := rate([]float64{0, 1, 2, 3, 4, 5}, []float64{0, 10, 2, math.NaN(), 6, 9})
	assert.True(t, math.IsNaN(r[0]))
	assert.Equal(t, 10.0, r[1])
	assert.True(t, math.IsNaN(r[2]), "a counter that went down (restart) is a gap")
	assert.True(t, math.IsNaN(r[3]))
	assert.True(t, math.IsNaN(r[4]), "the window restarts after a gap")
	assert.Equal(t, 3.0, r[5])
	// Steps of a scraped counter (0, 0, 8, 8, 16) average out over 1 s.
	q := rate([]float64{0, 0.25, 0.5, 0.75, 1, 1.25, 1.5}, []float64{0, 0, 8, 8, 16, 16, 24})
	assert.Equal(t, 16.0, q[4])
	assert.Equal(t, 16.0, q[5])
	assert.Equal(t, 16.0, q[6])
}

// TestFleetReportCapacity: the fleet report shows the capacity measurement's
// steps when the run measured it, and nothing in their place when the
// capacity was given (-capacity).
func TestFleetReportCapacity(t *testing.T) {
	for _, measured := range []bool{true, false} {
		dir := t.TempDir()
		put := func(name, content string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
		}
		put("summary.csv", "scenario,capacity_spans_s,burst_s\n")
		put("timeline.csv", "scenario,t_s\n")
		put("summary.md", "| gateway | delivered |\n|---|---|\n| throttle | 100% |\n")
		if measured {
			put(FleetCapacityFile, "| offered spans/s | delivered spans/s |\n|---|---|\n| 4000 | 4000 |\n\nCapacity: 4000 spans/s.\n")
		}
		files, err := GenerateFleet(dir)
		require.NoError(t, err)
		md, err := os.ReadFile(files.Markdown)
		require.NoError(t, err)
		assert.Contains(t, string(md), "| throttle | 100% |")
		assert.Equal(t, measured, strings.Contains(string(md), "Capacity: 4000 spans/s."), string(md))
	}
}
