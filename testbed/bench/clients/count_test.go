// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
)

func TestIDs(t *testing.T) {
	for _, tc := range []struct {
		client uint32
		seq    uint64
	}{{1, 0}, {7, 511}, {1 << 31, 1<<53 - 1}, {42, math.MaxUint64 - 1}} {
		tid, sid := encodeIDs(tc.client, tc.seq)
		c, s, ok := decodeTraceID(tid)
		require.True(t, ok)
		assert.Equal(t, tc.client, c)
		assert.Equal(t, tc.seq, s)
		assert.NotEqual(t, [8]byte{}, sid, "a span ID is never the invalid zero ID")
	}
	// The node client writes the same IDs as hex (js/client.js).
	tid, sid := encodeIDs(3, 0x1234)
	assert.Equal(t, "7468726f"+"00000003"+"0000000000001234", pcommon.TraceID(tid).String())
	assert.Equal(t, "0000000000001235", pcommon.SpanID(sid).String())

	_, _, ok := decodeTraceID([16]byte{1, 2, 3})
	assert.False(t, ok, "a trace ID of someone else")
}

func TestArrivals(t *testing.T) {
	a := &arrivals{}
	for _, s := range []uint64{0, 1, 63, 64, 65, 200, 5000, 64, 0} {
		a.add(s)
	}
	assert.EqualValues(t, 7, a.unique)
	assert.EqualValues(t, 2, a.dup)
	assert.EqualValues(t, 7, a.countIn(seqRange{0, 10000}))
	assert.EqualValues(t, 3, a.countIn(seqRange{63, 3}), "across a word boundary")
	assert.EqualValues(t, 0, a.countIn(seqRange{2, 61}))
	assert.EqualValues(t, 1, a.countIn(seqRange{5000, 1}))
	assert.EqualValues(t, 0, a.countIn(seqRange{1 << 40, 128}), "beyond what was ever seen")
}

// exportSpans sends spans seqs of client to the sink in one request.
func exportSpans(t *testing.T, s *sink, client uint32, seqs ...uint64) {
	t.Helper()
	td := ptrace.NewTraces()
	spans := td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans()
	for _, seq := range seqs {
		tid, sid := encodeIDs(client, seq)
		sp := spans.AppendEmpty()
		sp.SetTraceID(tid)
		sp.SetSpanID(sid)
	}
	_, err := s.Export(context.Background(), ptraceotlp.NewExportRequestFromTraces(td))
	require.NoError(t, err)
}

func seqs(from, to uint64) []uint64 {
	var out []uint64
	for s := from; s < to; s++ {
		out = append(out, s)
	}
	return out
}

// TestSinkCount: a client's result settled against the sink: lost spans
// split into given up and silent, given-up spans that arrived anyway,
// duplicates, and arrivals of sequence numbers never handed.
func TestSinkCount(t *testing.T) {
	s := &sink{clients: map[uint32]*arrivals{}}
	// Client 1 handed [0, 400) in four batches of 100; the exporter gave up
	// [100, 200), of which [150, 200) arrived all the same; [300, 310) was
	// lost silently; [0, 10) arrived twice.
	exportSpans(t, s, 1, seqs(0, 100)...)
	exportSpans(t, s, 1, seqs(150, 200)...)
	exportSpans(t, s, 1, seqs(200, 300)...)
	exportSpans(t, s, 1, seqs(310, 400)...)
	exportSpans(t, s, 1, seqs(0, 10)...)
	// Client 2: the agent never took [100, 200) (not handed), which arrived
	// anyway in part.
	exportSpans(t, s, 2, seqs(0, 100)...)
	exportSpans(t, s, 2, seqs(100, 120)...)
	// Someone else's span.
	td := ptrace.NewTraces()
	td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetTraceID(pcommon.TraceID{9})
	_, err := s.Export(context.Background(), ptraceotlp.NewExportRequestFromTraces(td))
	require.NoError(t, err)

	got := s.count(&result{ID: 1, SeqEnd: 400, Handed: 400, GivenUp: 100, GivenUpRanges: []seqRange{{100, 100}}})
	assert.Equal(t, tallyOf{Arrived: 340, Missing: 60, Duplicated: 10, MissingGivenUp: 50, GivenUpArrived: 50}, got)

	got = s.count(&result{ID: 2, SeqEnd: 200, Handed: 100, NotHanded: []seqRange{{100, 100}}})
	assert.Equal(t, tallyOf{Arrived: 100, Unexpected: 20}, got)

	got = s.count(&result{ID: 3, SeqEnd: 50, Handed: 50})
	assert.Equal(t, tallyOf{Missing: 50}, got, "a client of which nothing arrived")
	assert.EqualValues(t, 1, s.foreign)
	assert.EqualValues(t, 350+120+1, s.total())
}

// TestAppRun: the application hands every allocated batch once, counts it
// handed, ok or given up with the error's text, and reports the batches an
// agent never took as not handed.
func TestAppRun(t *testing.T) {
	a := &app{id: 5, name: "t", workers: 3, batch: 10, rate: 0, duration: 50 * time.Millisecond}
	var mu sync.Mutex
	seen := map[uint64]int{}
	res := a.run(func(seq, _ uint64) (bool, error) {
		mu.Lock()
		seen[seq]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		switch seq / 10 % 3 {
		case 1:
			return true, errors.New("refused after 3 attempts")
		case 2:
			return false, nil
		}
		return true, nil
	})
	require.Positive(t, res.Exports)
	assert.Equal(t, 10*res.Exports, res.SeqEnd, "every allocated batch was handed to hand")
	assert.Len(t, seen, int(res.Exports))
	for seq, n := range seen {
		assert.Equal(t, 1, n, "batch %d handed once", seq)
	}
	var notHanded uint64
	for _, r := range res.NotHanded {
		notHanded += r.Len
	}
	assert.Equal(t, res.SeqEnd, res.Handed+notHanded)
	assert.Equal(t, res.Handed, res.OK+res.GivenUp)
	assert.EqualValues(t, 10*len(res.GivenUpRanges), res.GivenUp)
	for _, r := range res.GivenUpRanges {
		assert.EqualValues(t, 1, r.Start/10%3)
	}
	if res.GivenUp > 0 {
		assert.Equal(t, map[string]uint64{"refused after N attempts": res.GivenUp / 10}, res.Errors)
	}
}

func TestOpens(t *testing.T) {
	nan := math.NaN()
	pts := []point{
		{t: 0, state: 0},
		{t: 1, state: 2, openDuration: 0},
		{t: 2, state: nan},
		{t: 3, state: 2, openDuration: 1.9},
		{t: 4, state: 1},
		{t: 5, state: 2, openDuration: 0.2},
		{t: 6, state: 2, openDuration: 1.1},
	}
	got := opens(pts)
	require.Len(t, got, 2)
	assert.Equal(t, openSpell{From: 1, To: 4, MaxReported: 1.9}, got[0], "a sample without a reading does not end an Open")
	assert.Equal(t, 5.0, got[1].From)
	assert.True(t, math.IsNaN(got[1].To), "still Open at the end")

	pts = []point{{t: 0, stress: false}, {t: 1, stress: true}, {t: 2, stress: true}, {t: 3}, {t: 4, stress: true}}
	sp := stressSpells(pts)
	require.Len(t, sp, 2)
	assert.Equal(t, [2]float64{1, 3}, sp[0])
	assert.True(t, math.IsNaN(sp[1][1]))
}

func TestCollectorLogLine(t *testing.T) {
	retry := "2026-12-03T18:59:30.123Z\tinfo\tinternal/retry_sender.go:133\tExporting failed. Will retry the request after interval.\t" +
		`{"resource": {"service.name": "otelcol"}, "error": "rpc error: code = ResourceExhausted desc = throttle: collector overloaded (open)", "interval": "12.5s"}`
	assert.Equal(t, "info: Exporting failed. Will retry the request after interval.: rpc error: code = ResourceExhausted desc = throttle: collector overloaded (open)",
		collectorLogLine(retry))
	drop := "2026-12-03T18:59:30.123Z\terror\tinternal/base_exporter.go:115\tExporting failed. Rejecting data.\t" +
		`{"error": "no more retries left: rpc error: code = Unavailable", "rejected_items": 512}`
	assert.Equal(t, "error: Exporting failed. Rejecting data.: no more retries left: rpc error: code = Unavailable", collectorLogLine(drop))
	assert.Empty(t, collectorLogLine("2026-12-03T18:59:30.123Z\tinfo\tservice@v0.165.0/service.go:1\tEverything is ready."))
	assert.Empty(t, collectorLogLine("not a log line"))
}

func TestFoldDigits(t *testing.T) {
	assert.Equal(t, "retry in Ns after N attempts", foldDigits("retry in 12.5s after 3 attempts"))
	long := foldDigits(string(make([]byte, 400)))
	assert.LessOrEqual(t, len(long), 303)
}
