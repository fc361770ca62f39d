// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// app is the "application" of a client process: workers that hand fixed
// batches to the exporter one at a time and wait for each, as a
// BatchSpanProcessor does, at a rate shared by the workers (0: as fast as
// the exporter answers). js/client.js is the same loop in node.
type app struct {
	id       uint32
	name     string
	workers  int
	batch    uint64
	rate     float64 // spans/s of the whole client
	duration time.Duration
	attrSize int
	out      string
}

func (a *app) register(fs *flag.FlagSet) {
	a.id = 1
	fs.Func("id", "client id, encoded in every span's trace ID (1 to 2^31; default 1)", func(s string) error {
		v, err := strconv.ParseUint(s, 10, 32)
		a.id = uint32(v)
		return err
	})
	fs.StringVar(&a.name, "name", "client", "client name (the report's)")
	fs.IntVar(&a.workers, "workers", 4, "workers, each with one export in flight at most")
	fs.Uint64Var(&a.batch, "batch", 512, "spans per export (the BatchSpanProcessor's default batch)")
	fs.Float64Var(&a.rate, "rate", 1000, "spans/s of the whole client; 0: each worker exports again as soon as the last export returned")
	fs.DurationVar(&a.duration, "duration", 30*time.Second, "how long the application hands spans")
	fs.IntVar(&a.attrSize, "attr-size", 64, "bytes of each span's payload attribute")
	fs.StringVar(&a.out, "result", "", "file the result is written to (JSON)")
}

func (a *app) validate() error {
	switch {
	case a.id == 0 || a.id > 1<<31:
		return fmt.Errorf("-id %d: want 1 to 2^31", a.id)
	case a.workers < 1:
		return fmt.Errorf("-workers %d: want >= 1", a.workers)
	case a.batch < 1:
		return fmt.Errorf("-batch %d: want >= 1", a.batch)
	case a.rate < 0:
		return fmt.Errorf("-rate %g: want >= 0", a.rate)
	case a.out == "":
		return errors.New("-result: a file is needed")
	}
	return nil
}

// handFunc hands the batch [seq, seq+n) to the exporter and returns once
// the exporter is done with it: handed is false when it never reached the
// exporter (only the agents' feeder, whose agent may refuse it), err is
// what the exporter reported.
type handFunc func(seq, n uint64) (handed bool, err error)

// run runs the workers for the duration and returns the result.
func (a *app) run(hand handFunc) *result {
	var (
		seqNext atomic.Uint64
		mu      sync.Mutex
		res     = &result{Client: a.name, ID: a.id}
		errs    tally
		lat     latencies
	)
	start := time.Now()
	end := start.Add(a.duration)
	var period time.Duration
	if a.rate > 0 {
		period = time.Duration(float64(time.Second) * float64(a.batch) * float64(a.workers) / a.rate)
	}
	var wg sync.WaitGroup
	for w := range a.workers {
		wg.Go(func() {
			// Workers start spread over one period, as independent
			// processors would.
			next := start.Add(period * time.Duration(w) / time.Duration(a.workers))
			for {
				now := time.Now()
				if next.After(now) {
					if !next.Before(end) {
						return
					}
					time.Sleep(next.Sub(now))
					now = time.Now()
				}
				if !now.Before(end) {
					return
				}
				// A worker that fell behind starts again from now: the
				// application never catches up with a burst.
				next = maxTime(next, now).Add(period)
				seq := seqNext.Add(a.batch) - a.batch
				t0 := time.Now()
				handed, err := hand(seq, a.batch)
				lat.add(time.Since(t0))
				r := seqRange{seq, a.batch}
				mu.Lock()
				res.Exports++
				switch {
				case !handed:
					res.NotHanded = append(res.NotHanded, r)
				case err != nil:
					res.Handed += r.Len
					res.GivenUp += r.Len
					res.GivenUpRanges = append(res.GivenUpRanges, r)
				default:
					res.Handed += r.Len
					res.OK += r.Len
				}
				mu.Unlock()
				if err != nil {
					errs.add(err.Error())
				}
			}
		})
	}
	wg.Wait()
	res.Seconds = min(time.Since(start), a.duration).Seconds()
	res.SeqEnd = seqNext.Load()
	res.Errors = errs.snapshot()
	res.LatencyMS = lat.quantiles()
	return res
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// payloadPool is the text span payloads are cut from: printable and
// varied enough that gzip does not shrink them to nothing (about 3:4, as
// for real attribute values), and cheap to cut.
var payloadPool = func() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
	var b strings.Builder
	x := uint64(0x9E3779B97F4A7C15)
	for range payloadPoolLen {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b.WriteByte(alphabet[x%uint64(len(alphabet))])
	}
	return b.String()
}()

const payloadPoolLen = 1 << 16

// payload is the payload attribute of span seq: size bytes of the pool
// from an offset that depends on seq.
func payload(size int, seq uint64) string {
	size = min(max(size, 0), payloadPoolLen)
	// An offset 7919 bytes on per span, wrapping within the pool.
	off := int(seq%payloadPoolLen/2) * 7919 % (payloadPoolLen - size + 1)
	return payloadPool[off : off+size]
}
