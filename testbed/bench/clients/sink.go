// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
)

// sink is the gateway's downstream: an OTLP/gRPC trace server in the
// driver's process that answers every export with success and records
// each span's client and sequence number (ids.go) once, so that the report
// has, per client, what arrived, what is missing and what arrived twice.
type sink struct {
	ptraceotlp.UnimplementedGRPCServer

	mu      sync.Mutex
	clients map[uint32]*arrivals
	// foreign: spans whose trace ID is not the matrix's.
	foreign uint64
	spans   uint64
	// slowest is the longest Export took to answer, waiting for the lock
	// included: an answer slower than the gateway exporter's timeout (5 s)
	// makes it send the batch again, and the batch's spans arrive twice.
	slowest time.Duration

	// hung, while set, is closed when the backend resumes: Export waits
	// for it, as a hung backend takes the call and does not answer.
	hung atomic.Pointer[chan struct{}]
	// slow, while set, is how long the backend takes per span: it takes
	// one call at a time (turn) and answers it after its spans' time, so
	// that it takes at most a fixed number of spans a second; a call whose
	// caller gives up while it waits for its turn costs nothing.
	slow atomic.Pointer[time.Duration]
	turn chan struct{}

	srv *grpc.Server
	ln  net.Listener
}

// hang makes the sink hang for d (or until ctx ends): every Export waits,
// or fails when its caller gives up first.
func (s *sink) hang(ctx context.Context, d time.Duration) {
	ch := make(chan struct{})
	s.hung.Store(&ch)
	defer func() { s.hung.Store(nil); close(ch) }()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// slowDown makes the sink take at most spansPerSec spans a second for d
// (or until ctx ends): a slow backend.
func (s *sink) slowDown(ctx context.Context, d time.Duration, spansPerSec float64) {
	perSpan := time.Duration(float64(time.Second) / spansPerSec)
	s.slow.Store(&perSpan)
	defer s.slow.Store(nil)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// pace waits for the sink's turn and then for n spans' time while the sink
// is slow; false when ctx ends first.
func (s *sink) pace(ctx context.Context, n int) bool {
	perSpan := s.slow.Load()
	if perSpan == nil {
		return true
	}
	select {
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-s.turn }()
	t := time.NewTimer(time.Duration(n) * *perSpan)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// arrivals is one client's arrived sequence numbers: a bitset (sequence
// numbers are dense from 0) and the count of repeated arrivals.
type arrivals struct {
	bits   []uint64
	unique uint64
	dup    uint64
}

func (a *arrivals) add(seq uint64) {
	w := seq / 64
	for w >= uint64(len(a.bits)) {
		a.bits = append(a.bits, make([]uint64, max(len(a.bits), 1024))...)
	}
	m := uint64(1) << (seq % 64)
	if a.bits[w]&m != 0 {
		a.dup++
		return
	}
	a.bits[w] |= m
	a.unique++
}

// has reports whether seq arrived.
func (a *arrivals) has(seq uint64) bool {
	w := seq / 64
	return w < uint64(len(a.bits)) && a.bits[w]&(uint64(1)<<(seq%64)) != 0
}

// countIn counts the arrived sequence numbers in r.
func (a *arrivals) countIn(r seqRange) uint64 {
	var n uint64
	seq, end := r.Start, r.Start+r.Len
	for seq < end && seq%64 != 0 {
		if a.has(seq) {
			n++
		}
		seq++
	}
	for ; seq+64 <= end; seq += 64 {
		if w := seq / 64; w < uint64(len(a.bits)) {
			n += popcount(a.bits[w])
		}
	}
	for ; seq < end; seq++ {
		if a.has(seq) {
			n++
		}
	}
	return n
}

// popcount is the number of bits set in x.
func popcount(x uint64) uint64 {
	n := uint64(0)
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// startSink listens on a free port of 127.0.0.1.
func startSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// The gateway's batches of large spans exceed gRPC's default 4 MiB.
	s := &sink{clients: map[uint32]*arrivals{}, ln: ln, turn: make(chan struct{}, 1), srv: grpc.NewServer(grpc.MaxRecvMsgSize(1 << 30))}
	ptraceotlp.RegisterGRPCServer(s.srv, s)
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *sink) addr() string { return s.ln.Addr().String() }

func (s *sink) stop() { s.srv.Stop() }

// Export records the request's spans and accepts it whole.
func (s *sink) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	start := time.Now()
	if ch := s.hung.Load(); ch != nil {
		select {
		case <-*ch:
		case <-ctx.Done():
			return ptraceotlp.NewExportResponse(), ctx.Err()
		}
	}
	if !s.pace(ctx, req.Traces().SpanCount()) {
		return ptraceotlp.NewExportResponse(), ctx.Err()
	}
	rss := req.Traces().ResourceSpans()
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() { s.slowest = max(s.slowest, time.Since(start)) }()
	for i := range rss.Len() {
		sss := rss.At(i).ScopeSpans()
		for j := range sss.Len() {
			spans := sss.At(j).Spans()
			for k := range spans.Len() {
				s.spans++
				client, seq, ok := decodeTraceID(spans.At(k).TraceID())
				if !ok {
					s.foreign++
					continue
				}
				a := s.clients[client]
				if a == nil {
					a = &arrivals{}
					s.clients[client] = a
				}
				a.add(seq)
			}
		}
	}
	return ptraceotlp.NewExportResponse(), nil
}

// total is every span received so far, the matrix's and foreign ones.
func (s *sink) total() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spans
}

// uniqueOf is the count of distinct spans of client arrived so far.
func (s *sink) uniqueOf(client uint32) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.clients[client]; a != nil {
		return a.unique
	}
	return 0
}

// tallyOf is the final count for one client.
type tallyOf struct {
	// Arrived: distinct handed spans that arrived; Missing: handed spans
	// that did not; Duplicated: arrivals beyond the first of a span;
	// Unexpected: distinct arrivals of sequence numbers never handed.
	Arrived, Missing, Duplicated, Unexpected uint64
	// MissingGivenUp: missing spans of batches the exporter reported as
	// given up; GivenUpArrived: spans of given-up batches that arrived all
	// the same (a timeout after the gateway had taken them).
	MissingGivenUp, GivenUpArrived uint64
}

// count settles one client's result against what arrived.
func (s *sink) count(r *result) tallyOf {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.clients[r.ID]
	if a == nil {
		a = &arrivals{}
	}
	var t tallyOf
	all := seqRange{0, r.SeqEnd}
	arrivedAll := a.countIn(all)
	var notHandedArrived uint64
	for _, h := range r.NotHanded {
		notHandedArrived += a.countIn(h)
	}
	t.Arrived = arrivedAll - notHandedArrived
	t.Missing = r.Handed - min(t.Arrived, r.Handed)
	for _, g := range r.GivenUpRanges {
		got := a.countIn(g)
		t.GivenUpArrived += got
		t.MissingGivenUp += g.Len - got
	}
	t.Duplicated = a.dup
	t.Unexpected = a.unique - t.Arrived
	return t
}
