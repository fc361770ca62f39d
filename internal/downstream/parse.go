// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package downstream // import "github.com/otelthrottle/throttle/internal/downstream"

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math"
	"strconv"
	"strings"
)

// The exporter helper's gauges of its sending queue (in the unit of the
// queue's sizer: requests, items or bytes), labelled with the exporter's ID
// and the signal.
const (
	metricSize     = "otelcol_exporter_queue_size"
	metricCapacity = "otelcol_exporter_queue_capacity"
)

// maxLine bounds the line buffer: a line longer than it (a metric with
// very long labels) is skipped, whichever metric it is.
const maxLine = 64 << 10

// Queue is one exporter's sending queue for one signal.
type Queue struct {
	Exporter, Signal string
	Size, Capacity   float64
}

// Fill is the share of the queue's capacity in use; 0 without a capacity.
func (q Queue) Fill() float64 {
	if q.Capacity <= 0 {
		return 0
	}
	return q.Size / q.Capacity
}

type queueKey struct{ exporter, signal string }

// parseQueues reads the sending queues out of a Prometheus text
// exposition: every exporter and signal with both gauges, in the order
// their sizes appear. Other lines are skipped without being parsed.
func parseQueues(r io.Reader) ([]Queue, error) {
	br := bufio.NewReaderSize(r, maxLine)
	var queues []Queue
	index := map[queueKey]int{}
	capacity := map[queueKey]float64{}
	for {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		var isSize bool
		switch {
		case bytes.HasPrefix(line, []byte(metricSize)):
			isSize, line = true, line[len(metricSize):]
		case bytes.HasPrefix(line, []byte(metricCapacity)):
			line = line[len(metricCapacity):]
		default:
			continue
		}
		k, v, ok := parseSample(string(line))
		if !ok {
			continue // another metric with this prefix, or a line it cannot be
		}
		if !isSize {
			capacity[k] = v
			continue
		}
		if _, seen := index[k]; !seen {
			index[k] = len(queues)
			queues = append(queues, Queue{Exporter: k.exporter, Signal: k.signal})
		}
		queues[index[k]].Size = v
	}
	var out []Queue
	for _, q := range queues {
		if c, ok := capacity[queueKey{q.Exporter, q.Signal}]; ok {
			q.Capacity = c
			out = append(out, q)
		}
	}
	return out, nil
}

// readLine returns the next line without its newline; a line longer than
// the reader's buffer is skipped whole. io.EOF once there is nothing more.
func readLine(br *bufio.Reader) ([]byte, error) {
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			continue
		}
		if errors.Is(err, io.EOF) && len(line) > 0 {
			return line, nil // the last line, without a newline
		}
		if err != nil {
			return nil, err
		}
		return line[:len(line)-1], nil
	}
}

// parseSample parses what follows a metric's name: `{labels} value
// [timestamp]`, keeping the exporter and data_type labels. ok is false for
// a longer name that starts with the same prefix, a series without an
// exporter label, and a value that is not a finite count.
func parseSample(s string) (k queueKey, v float64, ok bool) {
	if !strings.HasPrefix(s, "{") {
		return k, 0, false
	}
	s = s[1:]
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			s = s[1:]
			break
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return k, 0, false
		}
		name := strings.TrimSpace(s[:eq])
		val, rest, err := unquote(s[eq+1:])
		if err != nil {
			return k, 0, false
		}
		switch name {
		case "exporter":
			k.exporter = val
		case "data_type":
			k.signal = val
		}
		s = rest
	}
	fields := strings.Fields(s)
	if len(fields) == 0 || k.exporter == "" {
		return k, 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return k, 0, false // a size or a capacity is a count
	}
	return k, v, true
}

var errQuote = errors.New("unterminated label value")

// unquote reads one quoted label value at the start of s, with the text
// format's escapes (\\, \", \n), and returns what follows it.
func unquote(s string) (val, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			if i+1 >= len(s) {
				return "", "", errQuote
			}
			i++
			if s[i] == 'n' {
				b.WriteByte('\n')
			} else {
				b.WriteByte(s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errQuote
}
