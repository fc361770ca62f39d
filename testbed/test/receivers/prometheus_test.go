// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package receivers

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/testbed/test/internal/e2e"
)

// scrapeInterval is the prometheus receiver's scrape interval in the test.
const scrapeInterval = time.Second

// eventsPerScrape is what the target's counter grows by between two scrapes.
const eventsPerScrape = 10

// delivery is one scrape that reached the sink: the target's scrape number
// (its gauge), its counter and that counter's start time, and whether a
// point was flagged stale (no recorded value).
type delivery struct {
	at     time.Time
	seq    int64
	events float64
	start  pcommon.Timestamp
	stale  bool
}

// TestPrometheusThroughOpen: a prometheus scrape through an Open. A scrape
// is pull: the scrape loop commits a scrape's samples to the pipeline once
// and does not retry, so every scrape taken while the processor refuses is
// lost, by design ("Scrape commit failed" in the log,
// otelcol_receiver_refused_metric_points). The test measures exactly which:
// every scrape before the Open and after the recovery ramp arrives, none
// taken in the Open does, every refused scrape is counted and every lost
// one was refused, the first after the Open arrives within resumeWithin, no
// point is marked stale, and the counter carries every increment across
// the gap with the same start time (a rate over the gap is right; the
// gauge's values in it are gone).
func TestPrometheusThroughOpen(t *testing.T) {
	t.Parallel()
	r := runPrometheus(t, "", *openFor)

	assert.Zero(t, r.lostBefore, "scrapes lost before the Open")
	assert.Positive(t, r.inOpen)
	assert.Equal(t, r.inOpen, r.lostInOpen, "scrapes of the Open delivered: the processor let some through")
	assert.Positive(t, r.afterRamp)
	assert.Zero(t, r.lostAfterRamp, "scrapes lost after the recovery ramp")
	assert.Equal(t, float64(r.lost), r.refusedBatches, "scrapes lost and scrapes refused differ")
	assert.Equal(t, r.refusedItems, r.receiverRefusedPoints, "the receiver's refused points are not the processor's refusals")
	if assert.True(t, r.resumed, "nothing delivered after the Open") {
		assert.LessOrEqual(t, r.resume, resumeWithin, "first delivery after the Open ended")
	}
}

// TestPrometheusExemptMetrics: with the metrics signal exempt as in
// docs/processor.md (rules: metrics: {enabled: false}) the scrapes of the recovery ramp are kept; an
// exempt signal is still refused at the memory backstop, which a memory
// Open is, so the Open's scrapes are lost as before. A short Open shows it.
func TestPrometheusExemptMetrics(t *testing.T) {
	t.Parallel()
	r := runPrometheus(t, recipe(t, "prometheus", "extensions", "throttle"), 5*time.Second)

	assert.Positive(t, r.inOpen)
	assert.Equal(t, r.inOpen, r.lostInOpen, "exempt metrics went through at the memory backstop")
	assert.Positive(t, r.inRamp)
	assert.Zero(t, r.lostInRamp, "exempt metrics were refused in the recovery ramp")
	assert.Zero(t, r.lostAfterRamp)
}

// promResult is what runPrometheus measured: the target's scrapes by when
// they were served (before the Open, in it, in the recovery ramp, after
// it; a scrape interval at each boundary is left out) and how many of them
// never reached the sink.
type promResult struct {
	before, inOpen, inRamp, afterRamp                 int
	lostBefore, lostInOpen, lostInRamp, lostAfterRamp int
	lost                                              int     // of every scrape served
	refusedBatches, refusedItems                      float64 // the processor's
	receiverRefusedPoints                             float64
	resumed                                           bool
	resume                                            time.Duration
}

// runPrometheus runs a collector whose prometheus receiver scrapes a test
// target every scrapeInterval, the throttle extension configured with
// extensionKeys, holds the throttle in Open for hold, and waits for the
// recovery ramp and a few scrapes after it. It asserts what holds of every
// delivered scrape: once each, no point flagged stale, the counter's value
// and, across the Open, its start time and increase.
func runPrometheus(t *testing.T, extensionKeys string, hold time.Duration) promResult {
	t.Helper()

	// The target: a gauge that numbers its scrapes and a counter growing by
	// eventsPerScrape a scrape; served times are kept.
	var (
		targetMu sync.Mutex
		served   []time.Time // served[n-1]: when scrape n was served
	)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		targetMu.Lock()
		served = append(served, time.Now())
		n := len(served)
		targetMu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE target_scrape_seq gauge\ntarget_scrape_seq %d\n# TYPE target_events_total counter\ntarget_events_total %d\n",
			n, n*eventsPerScrape)
	}))
	t.Cleanup(target.Close)
	servedAt := func() []time.Time {
		targetMu.Lock()
		defer targetMu.Unlock()
		return append([]time.Time(nil), served...)
	}

	var (
		mu         sync.Mutex
		deliveries []delivery
	)
	delivered := func() []delivery {
		mu.Lock()
		defer mu.Unlock()
		return append([]delivery(nil), deliveries...)
	}
	sink := sinkFactory(nil, func(_ context.Context, md pmetric.Metrics) error {
		d := delivery{at: time.Now(), seq: -1}
		for _, rm := range md.ResourceMetrics().All() {
			for _, sm := range rm.ScopeMetrics().All() {
				for _, m := range sm.Metrics().All() {
					switch m.Name() {
					case "target_scrape_seq":
						for _, dp := range m.Gauge().DataPoints().All() {
							d.seq = int64(dp.DoubleValue())
							d.stale = d.stale || dp.Flags().NoRecordedValue()
						}
					case "target_events_total":
						for _, dp := range m.Sum().DataPoints().All() {
							d.events, d.start = dp.DoubleValue(), dp.StartTimestamp()
							d.stale = d.stale || dp.Flags().NoRecordedValue()
						}
					}
				}
			}
		}
		mu.Lock()
		deliveries = append(deliveries, d)
		mu.Unlock()
		return nil
	})

	th, ext := newThrottle()
	col := startCollector(t, ext, prometheusreceiver.NewFactory(), sink, decision.SignalMetrics, extensionKeys, fmt.Sprintf(`
    config:
      scrape_configs:
        - job_name: target
          scrape_interval: %s
          static_configs:
            - targets: [%q]`, scrapeInterval, target.Listener.Addr().String()))

	require.Eventually(t, func() bool { return len(delivered()) >= 3 }, 30*time.Second, 50*time.Millisecond,
		"no scrapes delivered before the Open")

	opened, closed := th.holdOpen(t, col, decision.SignalMetrics, hold)
	rampEnd := closed.Add(recoveryRamp)
	time.Sleep(recoveryRamp + 5*scrapeInterval)
	// Every scrape served so far has been delivered or refused a scrape
	// interval later.
	times := servedAt()
	time.Sleep(scrapeInterval)
	got := delivered()

	bySeq := map[int64]delivery{}
	for _, d := range got {
		require.GreaterOrEqual(t, d.seq, int64(1), "a scrape without the target's gauge (failed, or timed out on a loaded machine): %+v", d)
		_, dup := bySeq[d.seq]
		assert.False(t, dup, "scrape %d delivered twice", d.seq)
		bySeq[d.seq] = d
		assert.False(t, d.stale, "scrape %d has a point flagged stale", d.seq)
		assert.InDelta(t, float64(d.seq*eventsPerScrape), d.events, 0, "scrape %d's counter", d.seq)
	}

	var r promResult
	var firstAfterOpen *delivery
	for i, at := range times {
		d, ok := bySeq[int64(i+1)]
		count := func(n, lost *int) {
			*n++
			if !ok {
				*lost++
			}
		}
		switch {
		case at.Before(opened.Add(-scrapeInterval)):
			count(&r.before, &r.lostBefore)
		case at.After(opened) && at.Before(closed.Add(-scrapeInterval)):
			count(&r.inOpen, &r.lostInOpen)
		case at.After(closed) && at.Before(rampEnd):
			count(&r.inRamp, &r.lostInRamp)
		case at.After(rampEnd.Add(scrapeInterval)):
			count(&r.afterRamp, &r.lostAfterRamp)
		}
		if !ok {
			r.lost++
		}
		if ok && at.After(closed) && firstAfterOpen == nil {
			firstAfterOpen = &d
		}
	}
	if firstAfterOpen != nil {
		r.resumed, r.resume = true, firstAfterOpen.at.Sub(closed)
		// The counter carries the increments of the lost scrapes, with the
		// start time it had before the Open: no reset, no lost counts.
		var lastBefore *delivery
		for _, d := range got {
			if d.seq < firstAfterOpen.seq && (lastBefore == nil || d.seq > lastBefore.seq) {
				lastBefore = &d
			}
		}
		if assert.NotNil(t, lastBefore, "no scrape delivered before the Open") {
			assert.Equal(t, lastBefore.start, firstAfterOpen.start, "the counter's start time changed across the Open")
			assert.InDelta(t, float64((firstAfterOpen.seq-lastBefore.seq)*eventsPerScrape), firstAfterOpen.events-lastBefore.events, 0,
				"the counter's increase across the gap")
		}
	}

	counts := processorCounted(t, col, decision.SignalMetrics)
	r.refusedBatches, r.refusedItems = counts.refusedBatches, counts.refusedItems
	r.receiverRefusedPoints, _ = e2e.Sum(col.Samples(t), "otelcol_receiver_refused_metric_points", map[string]string{"receiver": "prometheus"})
	t.Logf("prometheus: Open %s, scrape_interval %s; scrapes served: %d before the Open (%d lost), %d in it (%d lost), %d in the %s recovery ramp (%d lost), %d after (%d lost)",
		seconds(closed.Sub(opened)), scrapeInterval, r.before, r.lostBefore, r.inOpen, r.lostInOpen, r.inRamp, recoveryRamp, r.lostInRamp, r.afterRamp, r.lostAfterRamp)
	t.Logf("prometheus: %d of %d scrapes lost; processor refused %.0f batches (%.0f points), passed %.0f points; receiver's refused_metric_points %.0f; first scrape delivered after the Open %s",
		r.lost, len(times), counts.refusedBatches, counts.refusedItems, counts.passedItems, r.receiverRefusedPoints, after(r.resumed, r.resume))
	return r
}
