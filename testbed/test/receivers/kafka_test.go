// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package receivers

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/receiver/kafkareceiver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/otelthrottle/throttle/internal/decision"
)

const (
	kafkaTopic = "throttle-logs"
	kafkaGroup = "throttle-e2e"
	// kafkaEvery and kafkaPerRecord: one Kafka record of 5 log records every
	// 50 ms, 100 log records/s over two partitions.
	kafkaEvery     = 50 * time.Millisecond
	kafkaPerRecord = 5
)

// TestKafkaThroughOpen: the kafka receiver with the recipe of
// docs/processor.md (mark a record only once the pipeline took it, retry a
// refused one at most a few seconds apart, for ever), consuming from
// an in-process broker while a producer keeps writing, through an Open:
// every log record arrives exactly once, the group's committed offsets stay
// where they were while the lag grows by what is produced, and after the
// Open the receiver resumes within resumeWithin and drains the backlog.
func TestKafkaThroughOpen(t *testing.T) {
	t.Parallel()
	r := runKafka(t, recipe(t, "kafka", "receivers", "kafka"), *openFor)

	assert.Zero(t, r.duplicates, "log records delivered more than once")
	assert.Zero(t, r.missing, "log records lost")
	assert.Equal(t, r.committedSettled, r.committedAtClose, "the committed offsets moved during the Open")
	assert.Equal(t, r.deliveredSettled, r.deliveredAtClose, "log records went through during the Open")
	assert.Positive(t, r.lagAtClose, "no lag built up during the Open")
	assert.GreaterOrEqual(t, r.lagAtClose, r.producedInOpen, "the lag at the Open's end is less than what was produced while the committed offsets held")
	if assert.True(t, r.resumed, "nothing delivered after the Open") {
		assert.LessOrEqual(t, r.resume, resumeWithin, "first delivery after the Open ended")
	}
	assert.True(t, r.drained, "the backlog of the Open was never delivered")
}

// TestKafkaDefaultsDrop: with the receiver's defaults (marking before the
// pipeline, no error_backoff) every record the processor refuses is marked
// and skipped: lost. This is why the recipe sets both; a short Open shows it.
func TestKafkaDefaultsDrop(t *testing.T) {
	t.Parallel()
	r := runKafka(t, "", 5*time.Second)
	assert.Positive(t, r.missing, "the defaults lost nothing: the recipe's text is stale")
	assert.Zero(t, r.duplicates)
}

// kafkaBody is the body of the i-th log record produced.
func kafkaBody(i int) string { return "id-" + strconv.Itoa(i) }

// kafkaResult is what runKafka measured.
type kafkaResult struct {
	produced, missing, duplicates int
	// The group's committed offsets (summed over the partitions) and the
	// log records delivered, settled into the Open and at its end.
	committedSettled, committedAtClose int64
	deliveredSettled, deliveredAtClose int
	producedInOpen, lagAtClose         int64
	resumed, drained                   bool
	resume, drain                      time.Duration
}

// kafkaOffsets is one sample of the group's offsets, summed over the topic's
// partitions.
type kafkaOffsets struct {
	committed, end int64
	delivered      int
	err            error
}

func (o kafkaOffsets) lag() int64 { return o.end - o.committed }

// runKafka runs a collector whose kafka receiver (settings: the receiver's
// keys beyond brokers, topic, group and initial offset) consumes log records
// from an in-process broker while a producer writes at a steady rate,
// holds the throttle in Open for hold, keeps producing for 5 s after it,
// and waits up to 60 s for everything produced to be delivered.
func runKafka(t *testing.T, settings string, hold time.Duration) kafkaResult {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, kafkaTopic))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()

	bodies := newLogBodies()
	th, ext := newThrottle()
	col := startCollector(t, ext, kafkareceiver.NewFactory(), sinkFactory(bodies.consume, nil), decision.SignalLogs, "", fmt.Sprintf(`
    brokers: [%q]
    group_id: %s
    initial_offset: earliest
    logs: { topics: [%s], encoding: otlp_proto }%s`, brokers[0], kafkaGroup, kafkaTopic, settings))

	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(kafkaTopic))
	require.NoError(t, err)
	t.Cleanup(client.Close)
	admin := kadm.NewClient(client)

	// The producer: log record bodies are unique ids.
	marshaler := plog.ProtoMarshaler{}
	producer := startSource(t, kafkaEvery, func(n int) error {
		ld := plog.NewLogs()
		lrs := ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords()
		for i := range kafkaPerRecord {
			lrs.AppendEmpty().Body().SetStr(kafkaBody(n*kafkaPerRecord + i))
		}
		value, err := marshaler.MarshalLogs(ld)
		if err != nil {
			return err
		}
		return client.ProduceSync(ctx, &kgo.Record{Key: []byte(strconv.Itoa(n)), Value: value}).FirstErr()
	})

	offsets := startRecorder(t, 250*time.Millisecond, func() kafkaOffsets {
		o := kafkaOffsets{delivered: bodies.distinct()}
		committed, err := admin.FetchOffsets(ctx, kafkaGroup)
		if err != nil {
			o.err = err
			return o
		}
		committed.Each(func(r kadm.OffsetResponse) {
			if r.Topic == kafkaTopic && r.At > 0 {
				o.committed += r.At
			}
		})
		ends, err := admin.ListEndOffsets(ctx, kafkaTopic)
		if err != nil {
			o.err = err
			return o
		}
		ends.Each(func(l kadm.ListedOffset) { o.end += l.Offset })
		return o
	})

	// Normal: the receiver joins the group and log records flow.
	require.Eventually(t, func() bool { return bodies.distinct() >= 50 }, 60*time.Second, 50*time.Millisecond,
		"no log records delivered before the Open")

	opened, closed := th.holdOpen(t, col, decision.SignalLogs, hold)
	producedAtClose := producer.produced() * kafkaPerRecord
	time.Sleep(5 * time.Second)
	producer.stop()
	total := producer.produced() * kafkaPerRecord
	// Done when the group has committed everything and nothing more
	// arrives: two samples in a row at the end offsets with the same count.
	done := func() bool {
		pts := offsets.all()
		a, b := pts[len(pts)-2].v, pts[len(pts)-1].v
		return a.err == nil && b.err == nil && a.committed == b.end && b.committed == b.end && a.delivered == b.delivered
	}
	require.Eventually(t, done, 60*time.Second, 100*time.Millisecond,
		"the group did not commit everything within 60 s of the producer's end")
	offsets.stop()

	r := kafkaResult{produced: total}
	r.missing, r.duplicates = bodies.tally(total, kafkaBody)

	atSettled := offsets.at(opened.Add(settled)).v
	atClose := offsets.at(closed).v
	r.committedSettled, r.committedAtClose = atSettled.committed, atClose.committed
	r.deliveredSettled, r.deliveredAtClose = atSettled.delivered, atClose.delivered
	r.producedInOpen, r.lagAtClose = atClose.end-atSettled.end, atClose.lag()
	var first, caughtUp point[kafkaOffsets]
	first, r.resumed = offsets.firstAfter(closed, func(o kafkaOffsets) bool { return o.delivered > atClose.delivered })
	r.resume = first.at.Sub(closed)
	caughtUp, r.drained = offsets.firstAfter(closed, func(o kafkaOffsets) bool { return o.delivered >= producedAtClose })
	r.drain = caughtUp.at.Sub(closed)
	for _, p := range offsets.all() {
		if p.v.err != nil && p.at.After(opened) {
			t.Logf("offset sample at %s: %v", p.at.Format("15:04:05.000"), p.v.err)
		}
	}

	counts := processorCounted(t, col, decision.SignalLogs)
	t.Logf("kafka: Open %s; produced %d log records in %d Kafka records, delivered %d distinct, %d missing, %d duplicates",
		seconds(closed.Sub(opened)), total, total/kafkaPerRecord, bodies.distinct(), r.missing, r.duplicates)
	t.Logf("kafka: from %s into the Open to its end: committed offsets %d -> %d, log records delivered %d -> %d, end offsets +%d, lag at the end %d records",
		settled, r.committedSettled, r.committedAtClose, r.deliveredSettled, r.deliveredAtClose, r.producedInOpen, r.lagAtClose)
	t.Logf("kafka: after the Open: first delivery %s, backlog of the Open delivered %s; processor refused %.0f batches (%.0f log records), passed %.0f log records",
		after(r.resumed, r.resume), after(r.drained, r.drain), counts.refusedBatches, counts.refusedItems, counts.passedItems)
	return r
}
