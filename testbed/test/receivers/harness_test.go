// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package receivers

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/receiver"
	"go.yaml.in/yaml/v3"

	throttleprocessor "github.com/otelthrottle/throttle"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/testbed/test/internal/e2e"
)

var openFor = flag.Duration("receivers.open", 30*time.Second, "how long each recipe test holds the throttle in Open")

// resumeWithin is how soon after the Open ends a receiver must deliver
// again, so that pausing costs it little more than the Open itself; the
// recipes' back-off settings are chosen to meet it with the extension's
// default 5 s recovery ramp.
const resumeWithin = 10 * time.Second

// throttleExtension is the extension's configuration in every test (a
// format for more of its keys): the defaults (lines, 250 ms checks, the 5 s
// recovery ramp, retry_after 1-5 s), without the Go soft memory limit, which
// would be the test process's own.
const throttleExtension = `
extensions:
  throttle:
    memory:
      soft_limit: { enabled: false }%s
`

// settled is how long into the Open a receiver has stopped: what was in
// flight is done, Kafka's autocommit (every 1 s) has committed the last
// marks, and the file reader has filled the batch it was reading into (100
// lines, 1 s of the writer's). From there to the Open's end nothing moves.
const settled = 3 * time.Second

// recoveryRamp is the extension's default recovery_ramp.
const recoveryRamp = 5 * time.Second

// The working set's shares of the memory limit that put the throttle in
// Normal (under every memory line) and in Open (over the hard line: Open in
// one check).
const (
	calmShare       = 0.10
	overloadedShare = 0.95
)

// throttleDriver moves the throttle extension of the collector under test
// between Normal and Open through the resource source it reads.
type throttleDriver struct{ src *testutil.Source }

// newThrottle is the one place the tests build the throttle extension: its
// own factory over a resource source the test controls (a 1 GiB memory
// limit, no CPU used), the working set at the Calm level.
func newThrottle() (*throttleDriver, extension.Factory) {
	src := testutil.NewSource(cgroup.Limits{MemLimit: 1 << 30})
	src.SetMemoryShare(calmShare)
	return &throttleDriver{src: src}, e2e.ExtensionFactory(src)
}

// open puts the working set over the hard memory line: Open at the next
// check.
func (d *throttleDriver) open() { d.src.SetMemoryShare(overloadedShare) }

// calm puts it back under every line: the state leaves Open at the next
// check, into the recovery ramp.
func (d *throttleDriver) calm() { d.src.SetMemoryShare(calmShare) }

// holdOpen holds the throttle in Open for hold and returns when sig's state
// was first seen Open and when it was first seen out of it again (the
// collector's otelcol_throttle_state).
func (d *throttleDriver) holdOpen(t *testing.T, col *e2e.Collector, sig decision.Signal, hold time.Duration) (opened, closed time.Time) {
	t.Helper()
	d.open()
	opened = waitState(t, col, sig, func(s decision.State) bool { return s == decision.StateOpen })
	time.Sleep(hold)
	d.calm()
	closed = waitState(t, col, sig, func(s decision.State) bool { return s != decision.StateOpen })
	return opened, closed
}

// waitState polls the collector's otelcol_throttle_state for sig until ok
// holds, and returns when it did.
func waitState(t *testing.T, col *e2e.Collector, sig decision.Signal, ok func(decision.State) bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if v, found := e2e.Sum(col.Samples(t), "otelcol_throttle_state", map[string]string{"signal": sig.String()}); found && ok(decision.State(v)) {
			return time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.FailNow(t, "the throttle state never changed", "signal %v", sig)
	return time.Time{}
}

// sinkType is the exporter at the end of every test pipeline.
var sinkType = component.MustNewType("sink")

type sinkConfig struct{}

type sinkLogs struct {
	component.StartFunc
	component.ShutdownFunc
	consumer.Logs
}

type sinkMetrics struct {
	component.StartFunc
	component.ShutdownFunc
	consumer.Metrics
}

// sinkFactory is an exporter that hands what reaches it to the test's
// functions (either may be nil when the test has no such pipeline).
func sinkFactory(logs consumer.ConsumeLogsFunc, metrics consumer.ConsumeMetricsFunc) exporter.Factory {
	return exporter.NewFactory(sinkType,
		func() component.Config { return &sinkConfig{} },
		exporter.WithLogs(func(context.Context, exporter.Settings, component.Config) (exporter.Logs, error) {
			c, err := consumer.NewLogs(logs)
			return sinkLogs{Logs: c}, err
		}, component.StabilityLevelDevelopment),
		exporter.WithMetrics(func(context.Context, exporter.Settings, component.Config) (exporter.Metrics, error) {
			c, err := consumer.NewMetrics(metrics)
			return sinkMetrics{Metrics: c}, err
		}, component.StabilityLevelDevelopment),
	)
}

// startCollector runs a collector with the throttle extension of newThrottle
// (throttleExtension with extensionKeys: YAML lines indented under it, or
// ""), and one sig pipeline: rf's receiver (receiverKeys likewise) -> the
// throttle processor -> sink.
func startCollector(t *testing.T, ext extension.Factory, rf receiver.Factory, sink exporter.Factory, sig decision.Signal, extensionKeys, receiverKeys string) *e2e.Collector {
	t.Helper()
	factories := func() (otelcol.Factories, error) {
		var f otelcol.Factories
		var err error
		if f.Extensions, err = otelcol.MakeFactoryMap(ext); err != nil {
			return f, err
		}
		if f.Receivers, err = otelcol.MakeFactoryMap(rf); err != nil {
			return f, err
		}
		if f.Processors, err = otelcol.MakeFactoryMap(throttleprocessor.NewFactory()); err != nil {
			return f, err
		}
		f.Exporters, err = otelcol.MakeFactoryMap(sink)
		return f, err
	}
	config := fmt.Sprintf(throttleExtension, extensionKeys) + fmt.Sprintf(`
receivers:
  %[1]s:%[2]s
processors:
  throttle: {}
exporters:
  sink: {}
service:
  extensions: [throttle]
  pipelines:
    %[3]s:
      receivers: [%[1]s]
      processors: [throttle]
      exporters: [sink]
`, rf.Type(), receiverKeys, sig)
	return e2e.StartCollector(t, factories, []byte(config))
}

// logBodies counts the log records that reach the sink by their body.
type logBodies struct {
	mu   sync.Mutex
	seen map[string]int
}

func newLogBodies() *logBodies { return &logBodies{seen: map[string]int{}} }

// consume is the sink's logs function.
func (b *logBodies) consume(_ context.Context, ld plog.Logs) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, rl := range ld.ResourceLogs().All() {
		for _, sl := range rl.ScopeLogs().All() {
			for _, lr := range sl.LogRecords().All() {
				b.seen[lr.Body().Str()]++
			}
		}
	}
	return nil
}

// distinct is how many different bodies arrived.
func (b *logBodies) distinct() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seen)
}

// tally returns how many of the bodies body(0) ... body(n-1) never arrived,
// and how many copies beyond the first arrived.
func (b *logBodies) tally(n int, body func(i int) string) (missing, duplicates int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range n {
		switch c := b.seen[body(i)]; {
		case c == 0:
			missing++
		case c > 1:
			duplicates += c - 1
		}
	}
	return missing, duplicates
}

// source calls produce(0), produce(1), ... every interval on its own
// goroutine, as a producer or writer at a steady rate, until stop; an error
// of produce ends it as a test error.
type source struct {
	n        atomic.Int64 // produce calls that succeeded
	stopping chan struct{}
	stop     func() // stops it and waits; it may be called again
}

func startSource(t *testing.T, every time.Duration, produce func(n int) error) *source {
	t.Helper()
	s := &source{stopping: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for n := 0; ; n++ {
			if err := produce(n); err != nil {
				t.Errorf("source: %v", err)
				return
			}
			s.n.Add(1)
			select {
			case <-s.stopping:
				return
			case <-tick.C:
			}
		}
	})
	s.stop = sync.OnceFunc(func() { close(s.stopping); wg.Wait() })
	t.Cleanup(s.stop)
	return s
}

// produced is how many produce calls succeeded.
func (s *source) produced() int { return int(s.n.Load()) }

// recipe returns the keys of component name under section (receivers,
// extensions) in the YAML block of docs/processor.md that follows the
// comment <!-- recipe: block -->, as YAML lines indented for a collector
// config (four spaces, with a leading newline): the tests run the recipe as
// documented.
func recipe(t *testing.T, block, section, name string) string {
	t.Helper()
	md, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "processor.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)<!-- recipe: " + regexp.QuoteMeta(block) + " -->\n```yaml\n(.*?)```").FindSubmatch(md)
	require.NotNil(t, m, "docs/processor.md has no yaml block after <!-- recipe: %s -->", block)
	var doc map[string]map[string]map[string]any
	require.NoError(t, yaml.Unmarshal(m[1], &doc), "the recipe block %q", block)
	keys, ok := doc[section][name]
	require.True(t, ok, "the recipe block %q has no %s::%s", block, section, name)
	out, err := yaml.Marshal(keys)
	require.NoError(t, err)
	var b strings.Builder
	for line := range strings.SplitSeq(strings.TrimRight(string(out), "\n"), "\n") {
		b.WriteString("\n    " + line)
	}
	return b.String()
}

// point is one sample of a recorder.
type point[T any] struct {
	at time.Time
	v  T
}

// recorder samples a value every interval on its own goroutine until stop.
type recorder[T any] struct {
	mu     sync.Mutex
	points []point[T]
	done   chan struct{}
	wg     sync.WaitGroup
}

func startRecorder[T any](t *testing.T, every time.Duration, sample func() T) *recorder[T] {
	t.Helper()
	r := &recorder[T]{done: make(chan struct{})}
	r.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			p := point[T]{at: time.Now(), v: sample()}
			r.mu.Lock()
			r.points = append(r.points, p)
			r.mu.Unlock()
			select {
			case <-r.done:
				return
			case <-tick.C:
			}
		}
	})
	t.Cleanup(r.stop)
	return r
}

// stop ends the sampling; it may be called again.
func (r *recorder[T]) stop() {
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	r.wg.Wait()
}

// all returns the points so far.
func (r *recorder[T]) all() []point[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]point[T](nil), r.points...)
}

// at returns the last point taken at or before when (the first point if
// none was).
func (r *recorder[T]) at(when time.Time) point[T] {
	pts := r.all()
	p := pts[0]
	for _, q := range pts {
		if q.at.After(when) {
			break
		}
		p = q
	}
	return p
}

// firstAfter returns the first point after when for which ok holds, and
// whether there is one.
func (r *recorder[T]) firstAfter(when time.Time, ok func(T) bool) (point[T], bool) {
	for _, p := range r.all() {
		if p.at.After(when) && ok(p.v) {
			return p, true
		}
	}
	return point[T]{}, false
}

// processorCounts is what the throttle processor counted for a signal.
type processorCounts struct {
	passedItems, refusedItems, refusedBatches float64
}

// processorCounted returns the throttle processor's counts for sig, from the
// collector's metrics.
func processorCounted(t *testing.T, col *e2e.Collector, sig decision.Signal) processorCounts {
	t.Helper()
	samples := col.Samples(t)
	get := func(name, outcome string) float64 {
		v, _ := e2e.Sum(samples, name, map[string]string{"signal": sig.String(), "outcome": outcome})
		return v
	}
	return processorCounts{
		passedItems:    get("otelcol_processor_throttle_items", "passed"),
		refusedItems:   get("otelcol_processor_throttle_items", "refused"),
		refusedBatches: get("otelcol_processor_throttle_batches", "refused"),
	}
}

// seconds formats d to a tenth of a second, for the figures.
func seconds(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

// after formats how long after the Open's end something happened, or
// "never".
func after(happened bool, d time.Duration) string {
	if !happened {
		return "never"
	}
	return "+" + seconds(d)
}
