// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package downstream measures how close the collector's exporters are to
// refusing: the fill of their sending queues, read from the collector's own
// metrics. The throttle holds the fullest queue to lines like CPU and
// memory, so that when the backend slows or hangs the receivers refuse
// before they decode, with a retry hint, instead of decoding what the full
// queue then refuses.
package downstream // import "github.com/otelthrottle/throttle/internal/downstream"

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/sampler"
)

// Resource names the downstream level in the telemetry, the logs and the
// status page.
const Resource = "downstream"

// maxBody bounds what one read takes in: a collector's own metrics are a
// few hundred KiB at most.
const maxBody = 16 << 20

// warnEvery bounds how often a failing read is logged.
const warnEvery = 30 * time.Second

// staleReads: a level older than this many intervals counts as unknown (and
// so as safe): the reads have stopped succeeding.
const staleReads = 4

// ErrNoQueue means the collector's metrics show no sending queue of the
// configured exporters: with sending_queue disabled, or exporters that do
// not exist, there is nothing to read.
var ErrNoQueue = errors.New("no exporter sending queue in the collector's metrics")

var errTooLarge = errors.New("the collector's metrics are too large to read")

// countingReader counts what was read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Options are the meter's collaborators. Every field is optional.
type Options struct {
	// Logger warns of failed reads, at most every 30s; nil: no log.
	Logger *zap.Logger
	// OnError is called on every failed read (to count it), from the
	// meter's goroutine.
	OnError func(error)
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Client makes the reads; a client with no proxy when nil.
	Client *http.Client
}

// Meter reads the exporters' queues on a goroutine of its own and gives
// the fullest one's fill as a level (Read). A meter of a disabled
// configuration reads nothing and its level is never valid.
type Meter struct {
	cfg       Config
	exporters map[string]bool // nil: every exporter
	logger    *zap.Logger
	onError   func(error)
	now       func() time.Time
	client    *http.Client

	last atomic.Pointer[reading]

	runMu  sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	// The meter's goroutine only.
	lastWarn time.Time
	// missingWarned: the configured exporters without a queue were named
	// in a warning, once.
	missingWarned bool
	// Read's caller only (the sampler's goroutine).
	lastSeq uint64
}

// reading is one successful read.
type reading struct {
	seq     uint64
	at      time.Time
	fullest Queue
}

// New returns the meter of cfg; nothing runs until Start.
func New(cfg Config, opts Options) *Meter {
	m := &Meter{cfg: cfg, logger: opts.Logger, onError: opts.OnError, now: opts.Now, client: opts.Client}
	if m.logger == nil {
		m.logger = zap.NewNop()
	}
	if m.onError == nil {
		m.onError = func(error) {}
	}
	if m.now == nil {
		m.now = time.Now
	}
	if m.client == nil {
		// No proxy, one connection kept, and no gzip: the collector would
		// compress its whole exposition four times a second for a reader
		// beside it.
		m.client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConns: 1, IdleConnTimeout: time.Minute, DisableCompression: true}}
	}
	if len(cfg.Exporters) > 0 {
		m.exporters = map[string]bool{}
		for _, e := range cfg.Exporters {
			m.exporters[e] = true
		}
	}
	return m
}

// Start reads once, then every interval until Stop. It does nothing for a
// disabled configuration, or when already started.
func (m *Meter) Start() {
	if !m.cfg.Enabled {
		return
	}
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.done != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	go m.run(ctx, m.done)
}

// Stop ends the reads; a read in progress is abandoned, so Stop never
// waits on the endpoint. Safe without Start and more than once.
func (m *Meter) Stop() {
	m.runMu.Lock()
	defer m.runMu.Unlock()
	if m.done == nil {
		return
	}
	m.cancel()
	<-m.done
	m.done = nil
	// The kept connection and its goroutines go with the meter.
	m.client.CloseIdleConnections()
}

func (m *Meter) run(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	var seq uint64
	for {
		seq++
		q, err := m.read(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			m.failed(err)
		default:
			m.last.Store(&reading{seq: seq, at: m.now(), fullest: q})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// read fetches the metrics and returns the fullest queue of the configured
// exporters.
func (m *Meter) read(ctx context.Context) (Queue, error) {
	ctx, cancel := context.WithTimeout(ctx, max(time.Second, 2*m.cfg.Interval))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.cfg.Endpoint, http.NoBody)
	if err != nil {
		return Queue{}, err
	}
	// The text format: the collector's Prometheus exporter negotiates
	// others (protobuf, OpenMetrics) only when asked.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := m.client.Do(req)
	if err != nil {
		return Queue{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return Queue{}, fmt.Errorf("GET %s: %s", m.cfg.Endpoint, resp.Status)
	}
	var r io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" { // sent unasked
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return Queue{}, fmt.Errorf("reading %s: %w", m.cfg.Endpoint, err)
		}
		defer zr.Close()
		r = zr
	}
	body := &countingReader{r: io.LimitReader(r, maxBody+1)}
	queues, err := parseQueues(body)
	if err != nil {
		return Queue{}, fmt.Errorf("reading %s: %w", m.cfg.Endpoint, err)
	}
	if body.n > maxBody {
		// Cut short, the last line read may be a number cut short.
		return Queue{}, fmt.Errorf("%w: %s is over %d MiB", errTooLarge, m.cfg.Endpoint, maxBody>>20)
	}
	return m.fullest(queues)
}

// fullest is the fullest of queues among the configured exporters.
func (m *Meter) fullest(queues []Queue) (Queue, error) {
	var best Queue
	found := false
	for _, q := range queues {
		if m.exporters != nil && !m.exporters[q.Exporter] {
			continue
		}
		if !found || q.Fill() > best.Fill() {
			best, found = q, true
		}
	}
	if found && m.exporters != nil && !m.missingWarned {
		if missing := m.missing(queues); len(missing) > 0 {
			m.missingWarned = true
			m.logger.Warn("throttle downstream: some of downstream.exporters have no sending queue in the collector's metrics; they are not watched",
				zap.Strings("exporters", missing), zap.String("exporters_with_a_queue", exporterList(queues)))
		}
	}
	if !found {
		if m.exporters != nil {
			return Queue{}, fmt.Errorf("%w of %s (exporters with a queue: %s)", ErrNoQueue, strings.Join(m.cfg.Exporters, ", "), exporterList(queues))
		}
		return Queue{}, fmt.Errorf("%w (is sending_queue enabled on the exporters?)", ErrNoQueue)
	}
	return best, nil
}

// missing are the configured exporters with no queue among queues.
func (m *Meter) missing(queues []Queue) []string {
	var out []string
	for _, e := range m.cfg.Exporters {
		if !slices.ContainsFunc(queues, func(q Queue) bool { return q.Exporter == e }) {
			out = append(out, e)
		}
	}
	return out
}

func exporterList(queues []Queue) string {
	var names []string
	for _, q := range queues {
		if !slices.Contains(names, q.Exporter) {
			names = append(names, q.Exporter)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func (m *Meter) failed(err error) {
	m.onError(err)
	now := m.now()
	if !m.lastWarn.IsZero() && now.Sub(m.lastWarn) < warnEvery {
		return
	}
	m.lastWarn = now
	m.logger.Warn("throttle downstream: cannot read the exporters' queues; the downstream level counts as safe until it can (logged at most every 30s)",
		zap.String("endpoint", m.cfg.Endpoint), zap.Error(err))
}

// Read is the downstream level: the fill of the fullest queue, not
// averaged (a queue's fill is a level, and the hard line must see it as
// soon as it is read). It is unknown (invalid, so safe) when disabled,
// before the first read, and once the reads have failed for a while; a
// level read before is Carried, no new frame of a breach. It is the
// sampler's Reader, called from one goroutine.
func (m *Meter) Read(*sampler.WaterLevel) sampler.Level {
	r := m.last.Load()
	if !m.cfg.Enabled || r == nil || m.now().Sub(r.at) > staleReads*m.cfg.Interval {
		return sampler.Level{}
	}
	carried := r.seq == m.lastSeq
	m.lastSeq = r.seq
	f := r.fullest.Fill()
	return sampler.Level{Valid: true, Carried: carried, Value: f, Slow: f, Fast: f}
}

// Fullest is the fullest queue of the last read, for the logs; ok is false
// when there is none.
func (m *Meter) Fullest() (q Queue, ok bool) {
	r := m.last.Load()
	if r == nil {
		return Queue{}, false
	}
	return r.fullest, true
}
