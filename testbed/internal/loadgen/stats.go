// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"encoding/csv"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Class is what became of a request.
type Class int

// Classes. HTTP and gRPC answers map onto the same classes so that runs of
// both protocols compare; the exact statuses and codes are kept as well.
const (
	// ClassOK: HTTP 2xx, gRPC OK.
	ClassOK Class = iota
	// ClassRejected: HTTP 429, gRPC RESOURCE_EXHAUSTED (throttle's answers).
	ClassRejected
	// ClassUnavailable: HTTP 503, gRPC UNAVAILABLE answered by the server
	// (memory_limiter's and otlpreceiver's "retry later").
	ClassUnavailable
	// ClassOther: any other status or code.
	ClassOther
	// ClassError: no answer: connection refused or reset, timeout, EOF.
	ClassError
	numClasses
)

// Result of one request.
type Result struct {
	Class Class
	// Code is the HTTP status, or the gRPC code; 0 for a transport error.
	Code int
	// Accepted items (the request's items less a partial success's rejects).
	Accepted int
	Latency  time.Duration
}

// Counts of requests and items.
type Counts struct {
	Sent        int64 // requests started
	OK          int64 // 2xx / OK
	Rejected    int64 // 429 / RESOURCE_EXHAUSTED
	Unavailable int64 // 503 / UNAVAILABLE
	Other       int64 // other statuses / codes
	Errors      int64 // transport errors and timeouts
	// Skipped requests were due in open loop while MaxInflight were in
	// flight: never sent.
	Skipped       int64
	SentItems     int64
	AcceptedItems int64
	SentBytes     int64
}

// Done is the number of answered or failed requests.
func (c Counts) Done() int64 { return c.OK + c.Rejected + c.Unavailable + c.Other + c.Errors }

// Add adds o's counts to c: the counts of several generators or phases.
func (c *Counts) Add(o Counts) {
	c.Sent += o.Sent
	c.OK += o.OK
	c.Rejected += o.Rejected
	c.Unavailable += o.Unavailable
	c.Other += o.Other
	c.Errors += o.Errors
	c.Skipped += o.Skipped
	c.SentItems += o.SentItems
	c.AcceptedItems += o.AcceptedItems
	c.SentBytes += o.SentBytes
}

func (c *Counts) addResult(r Result) {
	switch r.Class {
	case ClassOK:
		c.OK++
	case ClassRejected:
		c.Rejected++
	case ClassUnavailable:
		c.Unavailable++
	case ClassOther:
		c.Other++
	default:
		c.Errors++
	}
	c.AcceptedItems += int64(r.Accepted)
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of d,
// which it sorts in place; 0 when d is empty.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	if !slices.IsSorted(d) {
		slices.Sort(d)
	}
	rank := int(math.Ceil(p / 100 * float64(len(d))))
	rank = min(max(rank, 1), len(d))
	return d[rank-1]
}

// Snapshot is the cumulative state of a run at one moment, for a harness
// that samples it alongside the collector.
type Snapshot struct {
	At        time.Time
	Phase     string
	Inflight  int64
	Total     Counts
	PerSignal [numSignals]Counts
}

type phaseAcc struct {
	name      string
	perSignal [numSignals]Counts
	latencies []time.Duration // of successful requests
	codes     map[int]int64
}

type secKey struct {
	sec   int
	phase int // index in Recorder.phases
	sig   Signal
}

type secAcc struct {
	Counts
	latencies []time.Duration
}

// Recorder accumulates results per phase and per second. One mutex: at a
// few thousand requests per second it is nowhere near contended, and it keeps
// exact percentiles simple.
type Recorder struct {
	now      func() time.Time
	start    time.Time
	inflight atomic.Int64

	mu      sync.Mutex
	phase   int
	phases  []*phaseAcc
	cum     [numSignals]Counts
	seconds map[secKey]*secAcc
}

// NewRecorder starts the clock of the per-second buckets.
func NewRecorder(now func() time.Time) *Recorder {
	if now == nil {
		now = time.Now
	}
	return &Recorder{now: now, start: now(), seconds: map[secKey]*secAcc{}, phase: -1}
}

// StartPhase makes name the current phase and returns its index.
func (r *Recorder) StartPhase(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phases = append(r.phases, &phaseAcc{name: name, codes: map[int]int64{}})
	r.phase = len(r.phases) - 1
	return r.phase
}

func (r *Recorder) second(t time.Time) int { return int(t.Sub(r.start) / time.Second) }

func (r *Recorder) bucket(sec, phase int, s Signal) *secAcc {
	k := secKey{sec: sec, phase: phase, sig: s}
	b := r.seconds[k]
	if b == nil {
		b = &secAcc{}
		r.seconds[k] = b
	}
	return b
}

// Sent records the start of a request of phase (index from StartPhase).
func (r *Recorder) Sent(phase int, p *Payload) {
	r.inflight.Add(1)
	c := Counts{Sent: 1, SentItems: int64(p.Items), SentBytes: int64(len(p.Body))}
	now := r.now()
	r.mu.Lock()
	r.phases[phase].perSignal[p.Signal].Add(c)
	r.cum[p.Signal].Add(c)
	r.bucket(r.second(now), phase, p.Signal).Add(c)
	r.mu.Unlock()
}

// Skipped records a request that was due but not sent (open-loop cap).
func (r *Recorder) Skipped(phase int, s Signal) {
	c := Counts{Skipped: 1}
	now := r.now()
	r.mu.Lock()
	r.phases[phase].perSignal[s].Add(c)
	r.cum[s].Add(c)
	r.bucket(r.second(now), phase, s).Add(c)
	r.mu.Unlock()
}

// Done records the outcome of a request Sent before.
func (r *Recorder) Done(phase int, s Signal, res Result) {
	now := r.now()
	r.mu.Lock()
	pa := r.phases[phase]
	pa.perSignal[s].addResult(res)
	pa.codes[res.Code]++
	r.cum[s].addResult(res)
	b := r.bucket(r.second(now), phase, s)
	b.addResult(res)
	if res.Class == ClassOK {
		pa.latencies = append(pa.latencies, res.Latency)
		b.latencies = append(b.latencies, res.Latency)
	}
	r.mu.Unlock()
	r.inflight.Add(-1)
}

// Snapshot returns the cumulative counts so far.
func (r *Recorder) Snapshot() Snapshot {
	s := Snapshot{At: r.now(), Inflight: r.inflight.Load()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.phase >= 0 {
		s.Phase = r.phases[r.phase].name
	}
	s.PerSignal = r.cum
	for _, c := range r.cum {
		s.Total.Add(c)
	}
	return s
}

// CSVHeader is the header of the per-second CSV. One row per second, phase
// and signal that saw any request: sent and skipped count by the second the
// request was due, the outcomes by the second it completed, so a second's
// accepted_items is the goodput of that second. rejected_429 also counts gRPC
// RESOURCE_EXHAUSTED, unavailable_503 gRPC UNAVAILABLE; latencies are of the
// successful requests completed in that second.
var CSVHeader = []string{
	"second", "unix_ms", "phase", "signal", "sent", "ok", "rejected_429", "unavailable_503",
	"other", "errors", "skipped", "sent_items", "accepted_items", "sent_bytes", "p50_ms", "p99_ms", "max_ms",
}

// WriteSeconds writes the rows of every second before upTo (all of them
// when final) not written yet.
func (r *Recorder) WriteSeconds(w *csv.Writer, final bool) error {
	r.mu.Lock()
	upTo := r.second(r.now())
	if final {
		upTo = math.MaxInt
	}
	var keys []secKey
	for k := range r.seconds {
		if k.sec < upTo {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b secKey) int {
		if a.sec != b.sec {
			return a.sec - b.sec
		}
		if a.phase != b.phase {
			return a.phase - b.phase
		}
		return int(a.sig - b.sig)
	})
	rows := make([][]string, 0, len(keys))
	for _, k := range keys {
		b := r.seconds[k]
		delete(r.seconds, k)
		lat := b.latencies
		ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }
		var maxLat time.Duration
		if len(lat) > 0 {
			maxLat = slices.Max(lat)
		}
		rows = append(rows, []string{
			strconv.Itoa(k.sec),
			strconv.FormatInt(r.start.Add(time.Duration(k.sec)*time.Second).UnixMilli(), 10),
			r.phases[k.phase].name, k.sig.String(),
			i64(b.Sent), i64(b.OK), i64(b.Rejected), i64(b.Unavailable), i64(b.Other), i64(b.Errors), i64(b.Skipped),
			i64(b.SentItems), i64(b.AcceptedItems), i64(b.SentBytes),
			ms(Percentile(lat, 50)), ms(Percentile(lat, 99)), ms(maxLat),
		})
	}
	r.mu.Unlock()
	if err := w.WriteAll(rows); err != nil { // WriteAll flushes
		return err
	}
	return nil
}

func i64(v int64) string { return strconv.FormatInt(v, 10) }
