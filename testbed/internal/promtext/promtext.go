// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package promtext parses the Prometheus text exposition of the
// collector's own metrics, for tests and the overload harness.
package promtext // import "github.com/otelthrottle/throttle/testbed/internal/promtext"

import (
	"bufio"
	"strconv"
	"strings"
)

// Sample is one line of a Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Parse parses the Prometheus text format (no escapes inside
// label values beyond \" and \\, which is all the collector emits for these
// series). Comments and malformed lines are skipped.
func Parse(text string) []Sample {
	var out []Sample
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := Sample{Labels: map[string]string{}}
		var rest string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			s.Name = line[:i]
			parseLabels(line[i+1:j], s.Labels)
			rest = strings.TrimSpace(line[j+1:])
		} else {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			s.Name, rest = f[0], f[1]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.Value = v
		out = append(out, s)
	}
	return out
}

func parseLabels(s string, into map[string]string) {
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				val.WriteByte(s[i])
				continue
			}
			if c == '"' {
				break
			}
			val.WriteByte(c)
		}
		into[key] = val.String()
		s = strings.TrimLeft(s[min(i+1, len(s)):], ", ")
	}
}

// Sum adds the values of the samples named name (or name_total: the
// collector drops the suffix by default, a user's reader may keep it) whose
// labels include every pair of want.
func Sum(samples []Sample, name string, want map[string]string) (total float64, found bool) {
	for _, s := range samples {
		if s.Name != name && s.Name != name+"_total" {
			continue
		}
		ok := true
		for k, v := range want {
			if s.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			total += s.Value
			found = true
		}
	}
	return total, found
}
