// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"encoding/csv"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// noisyTimeline writes timeline.csv into dir: one scenario of n samples
// 250 ms apart, every column a random walk with sample-to-sample noise as
// large as the runs' (the CPU over 250 ms swings by tens of points, the
// counters' rates by half their value), from what row returns per sample.
func noisyTimeline(t *testing.T, dir string, header []string, n int, row func(i int, r *rand.Rand) map[string]float64) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "timeline.csv"))
	require.NoError(t, err)
	w := csv.NewWriter(f)
	require.NoError(t, w.Write(header))
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		vals := row(i, r)
		rec := make([]string, len(header))
		for j, h := range header {
			switch h {
			case "scenario":
				rec[j] = "D"
			case "t_s":
				rec[j] = strconv.FormatFloat(float64(i)*0.25, 'f', 3, 64)
			case "phase":
				rec[j] = "warmup"
				if i >= 40 && i < n-20 {
					rec[j] = "load"
				}
			default:
				if v, ok := vals[h]; ok {
					rec[j] = strconv.FormatFloat(v, 'f', 3, 64)
				}
			}
		}
		require.NoError(t, w.Write(rec))
	}
	w.Flush()
	require.NoError(t, w.Error())
	require.NoError(t, f.Close())
}

// counter accumulates a noisy rate into a cumulative counter.
type counter struct{ v float64 }

func (c *counter) add(r *rand.Rand, rate float64) float64 {
	c.v += max(0, rate*(0.5+r.Float64())) * 0.25
	return c.v
}

// TestChartsFitABaseline: a baseline keeps charts of at most MaxChartBytes
// (bench/results/README.md), and the longest runs' charts (a 10-minute soak,
// a fleet scenario through its whole drain) with noise in every series
// come out under it, as paletted PNGs of the full size.
func TestChartsFitABaseline(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: draws two charts of thousands of noisy samples (seconds each, a minute under -race)")
	}
	t.Run("overload", func(t *testing.T) {
		dir := t.TempDir()
		header := []string{
			"scenario", "t_s", "phase", "restarts", "oom_kills", "ws_pct", "cpu_pct", "state_traces", "state_metrics", "state_logs",
			"wl_cpu_slow", "wl_cpu_fast", "wl_mem", "cpu_enter", "cpu_exit", "cpu_hard", "memory_enter", "memory_exit", "memory_hard",
			"thr_denied_shed", "thr_denied_open", "thr_denied_budget", "inflight_reserved", "lg_ok", "lg_rejected", "lg_unavailable", "lg_other", "lg_errors",
		}
		var ok, rej, shed, open, budget counter
		ws, slow := 30.0, 80.0
		noisyTimeline(t, dir, header, 4*615, func(i int, r *rand.Rand) map[string]float64 {
			ws = min(95, max(5, ws+r.NormFloat64()*2))
			slow = 0.9*slow + 0.1*(90+r.NormFloat64()*10)
			state := float64(r.IntN(2))
			if r.IntN(50) == 0 {
				state = 2
			}
			return map[string]float64{
				"restarts": 0, "oom_kills": 0, "ws_pct": ws, "cpu_pct": 100 + r.NormFloat64()*25,
				"state_traces": state, "state_metrics": 0, "state_logs": state,
				"wl_cpu_slow": slow / 100, "wl_cpu_fast": (slow + r.NormFloat64()*15) / 100, "wl_mem": (ws + r.NormFloat64()*5) / 100,
				"cpu_enter": 0.9, "cpu_exit": 0.8, "cpu_hard": 1.1, "memory_enter": 0.85, "memory_exit": 0.78, "memory_hard": 0.92,
				"thr_denied_shed": shed.add(r, 100), "thr_denied_open": open.add(r, 20), "thr_denied_budget": budget.add(r, 700),
				"inflight_reserved": r.Float64() * (5 << 20),
				"lg_ok":             ok.add(r, 700), "lg_rejected": rej.add(r, 800), "lg_unavailable": 0, "lg_other": 0, "lg_errors": float64(i / 100),
			}
		})
		tl, err := ReadCSV(filepath.Join(dir, "timeline.csv"))
		require.NoError(t, err)
		series := loadSeries(tl)
		require.Len(t, series, 1)
		png := filepath.Join(dir, "timeline-D.png")
		require.NoError(t, writePNG(series[0], png), "the chart Generate writes, without its SVG twin")
		assertChartFits(t, png)
	})
	t.Run("fleet", func(t *testing.T) {
		dir := t.TempDir()
		var agIn, gwIn, sink, enq, sendf counter
		ws, q := 40.0, 0.0
		noisyTimeline(t, dir, timelineHeaderForTest, 4*480, func(i int, r *rand.Rand) map[string]float64 {
			ws = min(95, max(5, ws+r.NormFloat64()*3))
			q = max(0, q+r.NormFloat64()*5+0.5)
			return map[string]float64{
				"gw_ws_pct": ws, "gw_cpu_pct": 100 + r.NormFloat64()*25, "gw_wl_mem": (ws + r.NormFloat64()*8) / 100,
				"gw_state_traces": float64(r.IntN(3)), "host_cpu_pct": 60 + r.NormFloat64()*15,
				"ag_accepted_spans": agIn.add(r, 40000), "gw_accepted_spans": gwIn.add(r, 22000), "sink_accepted_spans": sink.add(r, 21000),
				"ag_queue_size": q, "gw_queue_size": math.Abs(r.NormFloat64() * 20),
				"ag_enqueue_failed_spans": enq.add(r, 50), "ag_send_failed_spans": sendf.add(r, 30),
				"gw_mem_enter": 0.85, "gw_mem_hard": 0.92, "gw_oom_kills": float64(i / 200), "gw_restarts": float64(i / 200),
			}
		})
		tl, err := ReadCSV(filepath.Join(dir, "timeline.csv"))
		require.NoError(t, err)
		series := loadFleetSeries(tl)
		require.Len(t, series, 1)
		series[0].Capacity, series[0].BurstStart, series[0].BurstEnd = 20000, 10, 70
		png := filepath.Join(dir, "timeline-D.png")
		require.NoError(t, writeFleetPNG(series[0], png), "the chart GenerateFleet writes")
		assertChartFits(t, png)
	})
}

// timelineHeaderForTest are the fleet timeline's columns the report reads.
var timelineHeaderForTest = []string{
	"scenario", "t_s", "phase", "gw_ws_pct", "gw_cpu_pct", "gw_wl_mem", "gw_state_traces", "host_cpu_pct",
	"ag_accepted_spans", "gw_accepted_spans", "sink_accepted_spans", "ag_queue_size", "gw_queue_size",
	"ag_enqueue_failed_spans", "ag_send_failed_spans", "gw_mem_enter", "gw_mem_hard", "gw_oom_kills", "gw_restarts",
}

func assertChartFits(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	t.Logf("%s: %d bytes", filepath.Base(path), st.Size())
	assert.LessOrEqual(t, st.Size(), int64(MaxChartBytes), "a chart larger than a baseline keeps")
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	assert.Greater(t, img.Bounds().Dx(), 1000, "charts keep their size: the palette makes them small")
}
