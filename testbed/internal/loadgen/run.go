// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	grpccodes "google.golang.org/grpc/codes"
)

// Runner runs the phases of a Config. It is safe to call Snapshot while Run
// runs (a harness samples it next to the collector's own figures).
type Runner struct {
	cfg      Config
	rec      *Recorder
	payloads map[payloadKey]*Payload
	schedule []Signal // weighted round robin of the signal mix
	next     atomic.Uint64
	snd      sender
}

// New validates cfg, encodes every request body the phases need, and
// prepares the client (no connection is made yet).
func New(cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, payloads: map[payloadKey]*Payload{}}
	// One cycle of the mix, interleaved so that a phase of any length sends
	// the shares asked for.
	r.schedule = interleave(cfg.Signals)
	conns := 1
	for _, p := range cfg.Phases {
		conns = max(conns, p.Concurrency, p.MaxInflight)
		for _, w := range cfg.Signals {
			k := payloadKey{signal: w.Signal, items: p.Items, attrSize: p.AttrSize}
			if r.payloads[k] != nil {
				continue
			}
			pl, err := buildPayload(w.Signal, p.Items, p.AttrSize, cfg.Encoding, cfg.Gzip, cfg.Resource)
			if err != nil {
				return nil, err
			}
			r.payloads[k] = pl
		}
	}
	if cfg.Protocol == GRPC {
		g, err := newGRPCSender(cfg)
		if err != nil {
			return nil, err
		}
		r.snd = g
	} else {
		r.snd = newHTTPSender(cfg, conns)
	}
	r.rec = NewRecorder(nil)
	return r, nil
}

// interleave spreads the shares over a cycle: traces:2,metrics:1 gives
// traces, metrics, traces rather than traces, traces, metrics.
func interleave(ws []Weighted) []Signal {
	total := 0
	for _, w := range ws {
		total += w.Weight
	}
	out := make([]Signal, 0, total)
	credit := make([]int, len(ws))
	for range total {
		// Smooth weighted round robin (as nginx): the highest credit goes.
		best := 0
		for i, w := range ws {
			credit[i] += w.Weight
			if credit[i] > credit[best] {
				best = i
			}
		}
		credit[best] -= total
		out = append(out, ws[best].Signal)
	}
	return out
}

// Snapshot returns the cumulative counts so far.
func (r *Runner) Snapshot() Snapshot { return r.rec.Snapshot() }

// Payloads describes the request bodies, for the run's header.
func (r *Runner) Payloads() []*Payload {
	out := make([]*Payload, 0, len(r.payloads))
	for _, p := range r.payloads {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *Payload) int {
		if a.Signal != b.Signal {
			return int(a.Signal - b.Signal)
		}
		return a.Items - b.Items
	})
	return out
}

// PhaseReport is the outcome of one phase.
type PhaseReport struct {
	Phase    Phase
	Protocol Protocol
	Start    time.Time
	// Issuing is how long requests were started (the phase's duration,
	// shorter when interrupted); Drained is when the last one ended.
	Issuing   time.Duration
	Drained   time.Time
	Total     Counts
	PerSignal map[Signal]Counts
	// Codes counts HTTP statuses or gRPC codes (0: transport error).
	Codes         map[int]int64
	P50, P99, Max time.Duration
	// GeneratorCPU is this process's CPU time over the phase.
	GeneratorCPU time.Duration
}

// Goodput is the accepted items per second of issuing time.
func (p *PhaseReport) Goodput() float64 {
	if p.Issuing <= 0 {
		return 0
	}
	return float64(p.Total.AcceptedItems) / p.Issuing.Seconds()
}

// Report is the outcome of a run.
type Report struct {
	Phases []*PhaseReport
}

// Run runs the phases in order and prints one summary per phase to out. It
// stops by itself: each phase issues for its duration, then waits for the
// requests in flight, each bounded by the request timeout. Cancelling ctx
// ends the run early (in-flight requests are cancelled); the report then
// holds what was done and Run returns ctx's error.
func (r *Runner) Run(ctx context.Context, out io.Writer) (*Report, error) {
	defer r.snd.close()
	var (
		csvW    *csv.Writer
		csvFile *os.File
		csvErr  error
		csvMu   sync.Mutex
	)
	if r.cfg.CSVPath != "" {
		f, err := os.Create(r.cfg.CSVPath)
		if err != nil {
			return nil, err
		}
		csvFile = f
		csvW = csv.NewWriter(f)
		if err := csvW.Write(CSVHeader); err != nil {
			f.Close()
			return nil, err
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					csvMu.Lock()
					if err := r.rec.WriteSeconds(csvW, false); err != nil && csvErr == nil {
						csvErr = err
					}
					csvMu.Unlock()
				}
			}
		}()
		defer func() {
			close(stop)
			<-done
			if err := r.rec.WriteSeconds(csvW, true); err != nil && csvErr == nil {
				csvErr = err
			}
			if err := csvFile.Close(); err != nil && csvErr == nil {
				csvErr = err
			}
			if csvErr != nil {
				fmt.Fprintf(out, "loadgen: writing %s: %v\n", r.cfg.CSVPath, csvErr)
			}
		}()
	}

	fmt.Fprintf(out, "loadgen: %s %s, encoding %s, gzip %v, signals %v, GOMAXPROCS %d\n",
		r.cfg.Protocol, r.cfg.Target, r.cfg.Encoding, r.cfg.Gzip, r.schedule, runtime.GOMAXPROCS(0))
	for _, p := range r.Payloads() {
		fmt.Fprintf(out, "  body %-7s %4d items: %8.1f KiB encoded, %8.1f KiB on the wire\n",
			p.Signal, p.Items, float64(p.RawSize)/1024, float64(len(p.Body))/1024)
	}
	rep := &Report{}
	for _, p := range r.cfg.Phases {
		if ctx.Err() != nil {
			break
		}
		pr := r.runPhase(ctx, p)
		rep.Phases = append(rep.Phases, pr)
		pr.Print(out)
	}
	return rep, ctx.Err()
}

func (r *Runner) pick() Signal {
	return r.schedule[(r.next.Add(1)-1)%uint64(len(r.schedule))]
}

func (r *Runner) one(ctx context.Context, phase int, p *Payload) {
	r.rec.Sent(phase, p)
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	res := r.snd.send(rctx, p)
	cancel()
	r.rec.Done(phase, p.Signal, res)
}

func (r *Runner) runPhase(ctx context.Context, p Phase) *PhaseReport {
	idx := r.rec.StartPhase(p.Name)
	cpu0 := processCPU()
	start := time.Now()
	deadline := start.Add(p.Duration)
	// issue stops starting requests at the deadline; in-flight requests
	// keep ctx so that they complete (bounded by the timeout) and count.
	issue, stop := context.WithDeadline(ctx, deadline)
	defer stop()
	payloadFor := func(s Signal) *Payload {
		return r.payloads[payloadKey{signal: s, items: p.Items, attrSize: p.AttrSize}]
	}
	var wg sync.WaitGroup
	if p.Rate <= 0 {
		for range p.Concurrency {
			wg.Go(func() {
				for issue.Err() == nil {
					r.one(ctx, idx, payloadFor(r.pick()))
				}
			})
		}
		<-issue.Done()
	} else {
		sem := make(chan struct{}, p.MaxInflight)
		issued := 0
		interval := time.Duration(float64(time.Second) / p.Rate)
		for issue.Err() == nil {
			now := time.Now()
			due := int(now.Sub(start).Seconds() * p.Rate)
			for ; issued < due; issued++ {
				pl := payloadFor(r.pick())
				select {
				case sem <- struct{}{}:
					wg.Go(func() {
						defer func() { <-sem }()
						r.one(ctx, idx, pl)
					})
				default:
					r.rec.Skipped(idx, pl.Signal)
				}
			}
			// Sleep to the next due request, at most 1 ms so that a late
			// wake-up is caught up in small bursts.
			wait := time.Until(start.Add(time.Duration(issued+1) * interval))
			wait = min(max(wait, 0), time.Millisecond)
			select {
			case <-issue.Done():
			case <-time.After(wait):
			}
		}
	}
	issuing := min(time.Since(start), p.Duration)
	wg.Wait()
	pr := &PhaseReport{
		Phase: p, Protocol: r.cfg.Protocol, Start: start, Issuing: issuing, Drained: time.Now(),
		GeneratorCPU: processCPU() - cpu0,
	}
	r.rec.mu.Lock()
	pa := r.rec.phases[idx]
	pr.PerSignal = map[Signal]Counts{}
	for s, c := range pa.perSignal {
		if c.Sent+c.Skipped > 0 {
			pr.PerSignal[Signal(s)] = c
		}
		pr.Total.Add(c)
	}
	pr.Codes = cloneCodes(pa.codes)
	lat := slices.Clone(pa.latencies)
	r.rec.mu.Unlock()
	pr.P50, pr.P99 = Percentile(lat, 50), Percentile(lat, 99)
	if len(lat) > 0 {
		pr.Max = lat[len(lat)-1]
	}
	return pr
}

func cloneCodes(m map[int]int64) map[int]int64 {
	out := make(map[int]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Print writes the phase's summary.
func (p *PhaseReport) Print(w io.Writer) {
	mode := fmt.Sprintf("closed loop, c=%d", p.Phase.Concurrency)
	if p.Phase.Rate > 0 {
		mode = fmt.Sprintf("open loop, %.0f req/s, max in flight %d", p.Phase.Rate, p.Phase.MaxInflight)
	}
	wall := p.Drained.Sub(p.Start).Seconds()
	fmt.Fprintf(w, "phase %s: %s, %d items/request, attr %d B, issued for %.1fs (drained at %.1fs)\n",
		p.Phase.Name, mode, p.Phase.Items, p.Phase.AttrSize, p.Issuing.Seconds(), wall)
	line := func(label string, c Counts) {
		if p.Protocol == GRPC {
			fmt.Fprintf(w, "  %-7s sent %d  OK %d  RESOURCE_EXHAUSTED %d  UNAVAILABLE %d  other %d  errors %d  skipped %d  accepted items %d\n",
				label, c.Sent, c.OK, c.Rejected, c.Unavailable, c.Other, c.Errors, c.Skipped, c.AcceptedItems)
			return
		}
		fmt.Fprintf(w, "  %-7s sent %d  2xx %d  429 %d  503 %d  other %d  errors %d  skipped %d  accepted items %d\n",
			label, c.Sent, c.OK, c.Rejected, c.Unavailable, c.Other, c.Errors, c.Skipped, c.AcceptedItems)
	}
	for s := Signal(0); s < numSignals; s++ {
		if c, ok := p.PerSignal[s]; ok && len(p.PerSignal) > 1 {
			line(s.String(), c)
		}
	}
	line("total", p.Total)
	codes := make([]int, 0, len(p.Codes))
	for c := range p.Codes {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	fmt.Fprintf(w, "  codes")
	for _, c := range codes {
		name := strconv.Itoa(c)
		switch {
		case p.Protocol == GRPC:
			name = grpcCodeName(c)
		case c == 0:
			name = "transport-error"
		}
		fmt.Fprintf(w, " %s:%d", name, p.Codes[c])
	}
	fmt.Fprintln(w)
	secs := p.Issuing.Seconds()
	fmt.Fprintf(w, "  goodput %.0f items/s (%.1f ok req/s, %.1f MiB/s sent)  latency of ok: p50 %s  p99 %s  max %s\n",
		p.Goodput(), float64(p.Total.OK)/secs, float64(p.Total.SentBytes)/secs/(1<<20),
		p.P50.Round(time.Microsecond*100), p.P99.Round(time.Microsecond*100), p.Max.Round(time.Microsecond*100))
	fmt.Fprintf(w, "  generator CPU %.2fs = %.2f cores (of %d)\n",
		p.GeneratorCPU.Seconds(), p.GeneratorCPU.Seconds()/max(wall, 1e-9), runtime.NumCPU())
}

// grpcCodeName names a gRPC status code kept as an int, or prints it when it
// is not one.
func grpcCodeName(c int) string {
	if c < 0 || c > math.MaxUint32 {
		return strconv.Itoa(c)
	}
	return grpccodes.Code(c).String()
}
