// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// Every span the matrix sends carries its client and its sequence number
// in its IDs, so that the sink counts each span once, whichever way it
// came (js/client.js encodes the same):
//
//	trace ID: "thro" (4 bytes) | client id (uint32, big endian) | seq (uint64, big endian)
//	span ID:  seq + 1 (uint64, big endian; never the invalid all-zero ID)
//
// Sequence numbers are allocated per client from 0, one contiguous range
// per batch, right before the batch is handed to the exporter.
const idMagic = 0x7468726f // "thro"

// encodeIDs returns the trace and span ID of span seq of client.
func encodeIDs(client uint32, seq uint64) (traceID [16]byte, spanID [8]byte) {
	binary.BigEndian.PutUint32(traceID[0:4], idMagic)
	binary.BigEndian.PutUint32(traceID[4:8], client)
	binary.BigEndian.PutUint64(traceID[8:16], seq)
	binary.BigEndian.PutUint64(spanID[:], seq+1)
	return traceID, spanID
}

// decodeTraceID returns the client and sequence number of a trace ID
// encodeIDs made; ok is false for any other trace ID.
func decodeTraceID(id [16]byte) (client uint32, seq uint64, ok bool) {
	if binary.BigEndian.Uint32(id[0:4]) != idMagic {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(id[4:8]), binary.BigEndian.Uint64(id[8:16]), true
}

// seqRange is a range of sequence numbers: [Start, Start+Len).
type seqRange struct {
	Start uint64 `json:"start"`
	Len   uint64 `json:"len"`
}

// result is what a client process reports when it ends (written as JSON
// to its -result file; js/client.js writes the same fields).
type result struct {
	Client string `json:"client"`
	ID     uint32 `json:"id"`
	// SeqEnd is the number of sequence numbers allocated; Handed the spans
	// handed to the exporter (SeqEnd less NotHanded).
	SeqEnd uint64 `json:"seq_end"`
	Handed uint64 `json:"handed"`
	// OK: spans of exports that succeeded; GivenUp: of exports the exporter
	// reported as failed, in GivenUpRanges.
	OK            uint64     `json:"ok"`
	GivenUp       uint64     `json:"given_up"`
	GivenUpRanges []seqRange `json:"given_up_ranges"`
	// NotHanded: allocated sequence numbers that never reached the
	// exporter (the agents' feeder: batches the agent refused until the end).
	NotHanded []seqRange `json:"not_handed"`
	// Refused: requests the agent refused (the feeder retries them).
	Refused uint64 `json:"refused"`
	// Exports is the number of export calls; LatencyMS their durations'
	// quantiles (p50, p99, max) in milliseconds.
	Exports   uint64             `json:"exports"`
	LatencyMS map[string]float64 `json:"latency_ms"`
	// Errors counts the exporter's errors by text; Logs what the client
	// library logged (digits folded, see foldDigits).
	Errors map[string]uint64 `json:"errors"`
	Logs   map[string]uint64 `json:"logs"`
	// Settings is what the client ran with, as it reports it.
	Settings map[string]string `json:"settings"`
	// Seconds is how long the application handed spans.
	Seconds float64 `json:"seconds"`
}

func (r *result) write(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func readResult(path string) (*result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

var digitsRE = regexp.MustCompile(`\d+(\.\d+)?`)

// foldDigits folds the numbers of a message to "N" and cuts it at 300
// bytes, so that one kind of message counts as one line of the report
// ("retry in 12.5s" and "retry in 3s" alike).
func foldDigits(s string) string {
	s = strings.TrimSpace(digitsRE.ReplaceAllString(s, "N"))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// tally counts messages by folded text, safe for concurrent use.
type tally struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (t *tally) add(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]uint64{}
	}
	t.m[foldDigits(msg)]++
}

func (t *tally) snapshot() map[string]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]uint64, len(t.m))
	for k, v := range t.m {
		out[k] = v
	}
	return out
}

// latencies keeps export durations for the result's quantiles.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) quantiles() map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return nil
	}
	s := append([]time.Duration(nil), l.d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return map[string]float64{"p50": ms(s[len(s)/2]), "p99": ms(s[len(s)*99/100]), "max": ms(s[len(s)-1])}
}
