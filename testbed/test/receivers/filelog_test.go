// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package receivers

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/receiver/filelogreceiver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// filelogEvery: the writer appends a line every 10 ms, 100 lines/s.
const filelogEvery = 10 * time.Millisecond

// TestFilelogThroughOpen: the filelog receiver with the recipe of
// docs/processor.md (retry a refused batch at most a few seconds apart, for
// ever; while it waits the receiver reads no further), reading a
// file the test keeps appending to, through an Open: every line arrives
// exactly once, the receiver's read position in the file stays where it was
// while the file grows, and after the Open it resumes within resumeWithin
// and reads to the end.
func TestFilelogThroughOpen(t *testing.T) {
	t.Parallel()
	r := runFilelog(t, recipe(t, "filelog", "receivers", "filelog"), *openFor)

	assert.Zero(t, r.duplicates, "lines delivered more than once")
	assert.Zero(t, r.missing, "lines lost")
	assert.Equal(t, r.posSettled, r.posAtClose, "the read position moved during the Open")
	assert.Equal(t, r.deliveredSettled, r.deliveredAtClose, "lines went through during the Open")
	assert.Greater(t, r.sizeAtClose, r.posAtClose, "the file did not grow past the read position during the Open")
	if assert.True(t, r.resumed, "nothing delivered after the Open") {
		assert.LessOrEqual(t, r.resume, resumeWithin, "first delivery after the Open ended")
	}
	assert.True(t, r.caughtUp, "the read position never reached the file's size at the Open's end")
}

// TestFilelogDefaultsDrop: without retry_on_failure (the default) a batch
// the processor refuses is dropped and the receiver reads on. A short Open
// shows it.
func TestFilelogDefaultsDrop(t *testing.T) {
	t.Parallel()
	r := runFilelog(t, "", 5*time.Second)
	assert.Positive(t, r.missing, "the defaults lost nothing: the recipe's text is stale")
	assert.Zero(t, r.duplicates)
}

// filelogLine is the n-th line written: numbered, about 100 bytes.
func filelogLine(n int) string { return fmt.Sprintf("line-%07d %s", n, strings.Repeat("x", 80)) }

// filelogResult is what runFilelog measured.
type filelogResult struct {
	written, missing, duplicates int
	// The receiver's read position in the file and the lines delivered,
	// settled into the Open and at its end.
	posSettled, posAtClose             int64
	deliveredSettled, deliveredAtClose int
	sizeAtClose                        int64
	resumed, caughtUp                  bool
	resume, catchUp                    time.Duration
}

// fileOffsets is one sample of the file: its size, the receiver's read
// position in it and the lines delivered.
type fileOffsets struct {
	size, pos int64
	open      bool // the receiver had the file open
	delivered int
}

// runFilelog runs a collector whose filelog receiver (settings: the
// receiver's keys beyond include and start_at) reads a file the test appends
// a numbered line to at a steady rate, holds the throttle in Open for hold,
// keeps writing for 5 s after it, and waits up to 60 s for the receiver to
// read to the end.
func runFilelog(t *testing.T, settings string, hold time.Duration) filelogResult {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	writerFD := strconv.FormatUint(uint64(f.Fd()), 10)

	bodies := newLogBodies()
	th, ext := newThrottle()
	col := startCollector(t, ext, filelogreceiver.NewFactory(), sinkFactory(bodies.consume, nil), decision.SignalLogs, "", fmt.Sprintf(`
    include: [%q]
    start_at: beginning%s`, path, settings))

	writer := startSource(t, filelogEvery, func(n int) error {
		_, err := fmt.Fprintln(f, filelogLine(n))
		return err
	})

	offsets := startRecorder(t, 250*time.Millisecond, func() fileOffsets {
		o := fileOffsets{delivered: bodies.distinct()}
		o.pos, o.open = readPosition(t, path, writerFD)
		if fi, err := os.Stat(path); err == nil {
			o.size = fi.Size()
		}
		return o
	})

	require.Eventually(t, func() bool { return bodies.distinct() >= 50 }, 30*time.Second, 50*time.Millisecond,
		"no lines delivered before the Open")

	opened, closed := th.holdOpen(t, col, decision.SignalLogs, hold)
	time.Sleep(5 * time.Second)
	writer.stop()
	total := writer.produced()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	// Done when the receiver has read to the end and every line arrived,
	// or nothing more arrived for longer than the retry's longest wait
	// (max_interval 2 s and its jitter): a batch refused late in the ramp
	// waits that long while the reader has read to the end.
	const quiet = 4 * time.Second
	done := func() bool {
		pts := offsets.all()
		last := pts[len(pts)-1]
		if !last.v.open || last.v.pos != fi.Size() {
			return false
		}
		if bodies.distinct() >= total {
			return true
		}
		for i := len(pts) - 1; i >= 0 && last.at.Sub(pts[i].at) <= quiet; i-- {
			if pts[i].v.delivered != last.v.delivered {
				return false
			}
		}
		return last.at.Sub(pts[0].at) > quiet
	}
	require.Eventually(t, done, 60*time.Second, 100*time.Millisecond,
		"the receiver did not read to the end within 60 s of the writer's end")
	offsets.stop()

	r := filelogResult{written: total}
	r.missing, r.duplicates = bodies.tally(total, filelogLine)

	atSettled := lastOpen(offsets, opened.Add(settled))
	atClose := lastOpen(offsets, closed)
	r.posSettled, r.posAtClose = atSettled.pos, atClose.pos
	r.deliveredSettled, r.deliveredAtClose = atSettled.delivered, atClose.delivered
	r.sizeAtClose = atClose.size
	var first, caughtUp point[fileOffsets]
	first, r.resumed = offsets.firstAfter(closed, func(o fileOffsets) bool { return o.delivered > atClose.delivered })
	r.resume = first.at.Sub(closed)
	caughtUp, r.caughtUp = offsets.firstAfter(closed, func(o fileOffsets) bool { return o.open && o.pos >= atClose.size })
	r.catchUp = caughtUp.at.Sub(closed)

	counts := processorCounted(t, col, decision.SignalLogs)
	t.Logf("filelog: Open %s; wrote %d lines, delivered %d distinct, %d missing, %d duplicates",
		seconds(closed.Sub(opened)), total, bodies.distinct(), r.missing, r.duplicates)
	t.Logf("filelog: from %s into the Open to its end: read position %d -> %d bytes, lines delivered %d -> %d, file size at the end %d bytes (%d behind)",
		settled, r.posSettled, r.posAtClose, r.deliveredSettled, r.deliveredAtClose, r.sizeAtClose, r.sizeAtClose-r.posAtClose)
	t.Logf("filelog: after the Open: first delivery %s, read position at the Open's end-of-file %s; processor refused %.0f batches (%.0f lines), passed %.0f lines",
		after(r.resumed, r.resume), after(r.caughtUp, r.catchUp), counts.refusedBatches, counts.refusedItems, counts.passedItems)
	return r
}

// lastOpen returns the last sample at or before when in which the receiver
// had the file open.
func lastOpen(r *recorder[fileOffsets], when time.Time) fileOffsets {
	var o fileOffsets
	for _, p := range r.all() {
		if p.at.After(when) {
			break
		}
		if p.v.open {
			o = p.v
		}
	}
	return o
}

// readPosition returns the furthest read position among this process's
// descriptors of path but the writer's (writerFD), from /proc/self/fdinfo
// (Linux): the receiver's offset in the file, ahead of what it has emitted
// by at most its read buffer. ok is false when the receiver does not have
// the file open.
func readPosition(t *testing.T, path, writerFD string) (pos int64, ok bool) {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Errorf("list open files: %v", err)
		return 0, false
	}
	for _, e := range entries {
		if e.Name() == writerFD {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != path {
			continue
		}
		info, err := os.Open(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		sc := bufio.NewScanner(info)
		for sc.Scan() {
			if v, found := strings.CutPrefix(sc.Text(), "pos:"); found {
				if p, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && (!ok || p > pos) {
					pos, ok = p, true
				}
			}
		}
		info.Close()
	}
	return pos, ok
}
