// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"bytes"
	"encoding/csv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/testutil"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	assert.Zero(t, Percentile(nil, 99))
	assert.Equal(t, 7*time.Millisecond, Percentile(ms(7), 50))
	assert.Equal(t, 7*time.Millisecond, Percentile(ms(7), 99))
	// Nearest rank over 1..100: p50 is the 50th value, p99 the 99th.
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // unsorted on purpose
	}
	d := ms(hundred...)
	assert.Equal(t, 50*time.Millisecond, Percentile(d, 50))
	assert.Equal(t, 99*time.Millisecond, Percentile(d, 99))
	assert.Equal(t, 100*time.Millisecond, Percentile(d, 100))
	assert.Equal(t, 1*time.Millisecond, Percentile(d, 0.1))
	// Ten values: p99 is the largest, p50 the fifth.
	assert.Equal(t, 10*time.Millisecond, Percentile(ms(3, 1, 2, 10, 9, 8, 7, 6, 5, 4), 99))
	assert.Equal(t, 5*time.Millisecond, Percentile(ms(3, 1, 2, 10, 9, 8, 7, 6, 5, 4), 50))
}

func TestRecorder(t *testing.T) {
	clk := testutil.NewClock(time.Unix(1000, 0))
	r := NewRecorder(clk.Now)
	tr := &Payload{Signal: Traces, Items: 10, Body: make([]byte, 100)}
	mt := &Payload{Signal: Metrics, Items: 5, Body: make([]byte, 50)}

	w := r.StartPhase("warmup")
	r.Sent(w, tr)
	r.Sent(w, tr)
	r.Sent(w, mt)
	r.Done(w, Traces, Result{Class: ClassOK, Code: 200, Accepted: 10, Latency: 4 * time.Millisecond})
	r.Done(w, Traces, Result{Class: ClassRejected, Code: 429, Latency: time.Millisecond})
	s := r.Snapshot()
	assert.Equal(t, "warmup", s.Phase)
	assert.Equal(t, int64(1), s.Inflight)
	assert.Equal(t, Counts{Sent: 3, OK: 1, Rejected: 1, SentItems: 25, AcceptedItems: 10, SentBytes: 250}, s.Total)
	assert.Equal(t, Counts{Sent: 1, SentItems: 5, SentBytes: 50}, s.PerSignal[Metrics])

	clk.Advance(1500 * time.Millisecond) // second 1
	r.Done(w, Metrics, Result{Class: ClassError, Latency: time.Second})
	b := r.StartPhase("burst")
	r.Sent(b, tr)
	r.Skipped(b, Traces)
	r.Done(b, Traces, Result{Class: ClassUnavailable, Code: 503})

	var buf bytes.Buffer
	cw := csv.NewWriter(&buf)
	require.NoError(t, cw.Write(CSVHeader))
	require.NoError(t, r.WriteSeconds(cw, false)) // second 0 only: 1 is not over
	require.NoError(t, r.WriteSeconds(cw, true))
	rows, err := csv.NewReader(&buf).ReadAll()
	require.NoError(t, err)
	assert.Equal(t, [][]string{
		CSVHeader,
		{"0", "1000000", "warmup", "traces", "2", "1", "1", "0", "0", "0", "0", "20", "10", "200", "4.00", "4.00", "4.00"},
		{"0", "1000000", "warmup", "metrics", "1", "0", "0", "0", "0", "0", "0", "5", "0", "50", "0.00", "0.00", "0.00"},
		{"1", "1001000", "warmup", "metrics", "0", "0", "0", "0", "0", "1", "0", "0", "0", "0", "0.00", "0.00", "0.00"},
		{"1", "1001000", "burst", "traces", "1", "0", "0", "1", "0", "0", "1", "10", "0", "100", "0.00", "0.00", "0.00"},
	}, rows)
	// Written rows are not written again.
	require.NoError(t, r.WriteSeconds(cw, true))
	assert.Empty(t, r.seconds)
	s = r.Snapshot()
	assert.Zero(t, s.Inflight)
	assert.Equal(t, "burst", s.Phase)
	assert.Equal(t, Counts{Sent: 4, OK: 1, Rejected: 1, Unavailable: 1, Errors: 1, Skipped: 1, SentItems: 35, AcceptedItems: 10, SentBytes: 350}, s.Total)
}
