// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// The parse functions below take the raw bytes of one file and never
// allocate on success: the sampler calls them every tick and the contract is
// "no allocation per tick apart from what reading files needs".

var (
	errEmpty    = errors.New("empty value")
	errSyntax   = errors.New("invalid number")
	errRange    = errors.New("number out of range")
	errNoKey    = errors.New("key not found")
	errZero     = errors.New("must be > 0")
	errNegative = errors.New("negative value")
)

// v1UnlimitedMemory is the threshold at or above which a v1
// memory.limit_in_bytes means "no limit". The kernel reports an unset limit
// as PAGE_COUNTER_MAX scaled to bytes (9223372036854771712 on 4 KiB pages;
// other page sizes give other values near 1<<63), so compare with a bound
// rather than with one magic number. 1<<60 bytes (1 EiB) is more memory than
// any machine has, so nothing real is lost.
const v1UnlimitedMemory = 1 << 60

// maxCPUSetIndex bounds the CPU numbers accepted in a cpuset list so a
// corrupt file cannot make the count overflow. Linux's NR_CPUS tops out at
// 8192 today; leave room.
const maxCPUSetIndex = 1 << 20

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func trimSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// parseUint parses a decimal unsigned integer surrounded by optional white
// space. strconv.ParseUint would need a string conversion that allocates
// (its error keeps the string), hence this small loop.
func parseUint(b []byte) (uint64, error) {
	b = trimSpace(b)
	if len(b) == 0 {
		return 0, errEmpty
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errSyntax
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, errRange
		}
		n = n*10 + d
	}
	return n, nil
}

// parseInt parses a decimal signed integer (v1 writes -1 for "no quota").
func parseInt(b []byte) (int64, error) {
	b = trimSpace(b)
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) > 0 && isSpace(b[0]) {
			return 0, errSyntax
		}
	}
	u, err := parseUint(b)
	if err != nil {
		return 0, err
	}
	if neg {
		if u > 1<<63 {
			return 0, errRange
		}
		// u == 1<<63 converts to math.MinInt64, which negates to itself: the
		// right value.
		return -int64(u), nil //nolint:gosec // G115: u <= 1<<63, checked above; see the comment
	}
	if u > math.MaxInt64 {
		return 0, errRange
	}
	return int64(u), nil
}

// parseKeyValue returns the value of key in a flat keyed file such as
// cpu.stat or memory.stat ("key value" per line). A missing key is an error:
// the files this package reads always carry the keys it asks for, so a
// missing one means the wrong file or a truncated read.
func parseKeyValue(data []byte, key string) (uint64, error) {
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(line) > len(key) && string(line[:len(key)]) == key && isSpace(line[len(key)]) {
			return parseUint(line[len(key):])
		}
	}
	return 0, errNoKey
}

// parseCPUMax parses a v2 cpu.max ("quota period" or "max period") into
// cores, 0 meaning no quota. A quota or period of 0, or a line without its
// period, is an error: the kernel never writes them, so the file is not what
// it should be and guessing a limit from it would be worse than reporting.
func parseCPUMax(data []byte) (float64, error) {
	data = trimSpace(data)
	i := bytes.IndexAny(data, " \t")
	if i < 0 {
		if string(data) == "max" {
			// Reading cpu.max always gives the period too, but "max" alone
			// is unambiguous.
			return 0, nil
		}
		return 0, fmt.Errorf("want \"quota period\": %w", errSyntax)
	}
	q, p := data[:i], data[i+1:]
	period, err := parseUint(p)
	if err != nil {
		return 0, fmt.Errorf("period: %w", err)
	}
	if period == 0 {
		return 0, fmt.Errorf("period: %w", errZero)
	}
	if string(q) == "max" {
		return 0, nil
	}
	quota, err := parseUint(q)
	if err != nil {
		return 0, fmt.Errorf("quota: %w", err)
	}
	if quota == 0 {
		return 0, fmt.Errorf("quota: %w", errZero)
	}
	return float64(quota) / float64(period), nil
}

// parseV1Quota interprets cpu.cfs_quota_us. Only -1 on
// the quota means "no quota" (none is true); 0 or other negative numbers are
// errors for the same reason as in parseCPUMax. The period is parsed
// separately (parseV1Period) because it is only needed when there is a quota.
func parseV1Quota(quotaData []byte) (quota int64, none bool, err error) {
	quota, err = parseInt(quotaData)
	if err != nil {
		return 0, false, err
	}
	switch {
	case quota == -1:
		return 0, true, nil
	case quota == 0:
		return 0, false, errZero
	case quota < 0:
		return 0, false, errNegative
	}
	return quota, false, nil
}

// parseV1Period parses cpu.cfs_period_us, which must be positive.
func parseV1Period(data []byte) (int64, error) {
	p, err := parseInt(data)
	if err != nil {
		return 0, err
	}
	switch {
	case p == 0:
		return 0, errZero
	case p < 0:
		return 0, errNegative
	}
	return p, nil
}

// parseMemoryMax parses a v2 memory.max ("max" = no limit, returned as 0).
// A limit of 0 is an error: the process could not run under it, and 0 means
// "none" in Limits, so it cannot be passed through.
func parseMemoryMax(data []byte) (uint64, error) {
	data = trimSpace(data)
	if string(data) == "max" {
		return 0, nil
	}
	v, err := parseUint(data)
	if err != nil {
		return 0, err
	}
	if v == 0 {
		return 0, errZero
	}
	return v, nil
}

// parseV1MemoryLimit parses memory.limit_in_bytes; values at or above
// v1UnlimitedMemory mean no limit (returned as 0). A negative value is an
// error (the kernel reports -1 written by users as the sentinel).
func parseV1MemoryLimit(data []byte) (uint64, error) {
	v, err := parseInt(data)
	if errors.Is(err, errRange) {
		// Above MaxInt64: certainly the unlimited range.
		if _, uerr := parseUint(data); uerr == nil {
			return 0, nil
		}
	}
	if err != nil {
		return 0, err
	}
	switch {
	case v < 0:
		return 0, errNegative
	case v == 0:
		return 0, errZero
	case v >= v1UnlimitedMemory:
		return 0, nil
	}
	return uint64(v), nil
}

// parseCPUSet counts the CPUs in a cpuset list such as "0-3,5,7-8" (7).
// An empty list returns 0 (unknown): v1 leaves cpuset.cpus empty in a child
// until it is set, and the caller then looks at the parent.
func parseCPUSet(data []byte) (int, error) {
	data = trimSpace(data)
	if len(data) == 0 {
		return 0, nil
	}
	n := 0
	for len(data) > 0 {
		item := data
		if i := bytes.IndexByte(data, ','); i >= 0 {
			item, data = data[:i], data[i+1:]
			if len(data) == 0 {
				return 0, fmt.Errorf("trailing comma: %w", errSyntax)
			}
		} else {
			data = nil
		}
		lo, hi := item, item
		if i := bytes.IndexByte(item, '-'); i >= 0 {
			lo, hi = item[:i], item[i+1:]
		}
		a, err := parseCPUIndex(lo)
		if err != nil {
			return 0, err
		}
		b, err := parseCPUIndex(hi)
		if err != nil {
			return 0, err
		}
		if b < a {
			return 0, fmt.Errorf("range %d-%d: %w", a, b, errRange)
		}
		n += b - a + 1
	}
	return n, nil
}

func parseCPUIndex(b []byte) (int, error) {
	// Spaces inside the list are not kernel output; reject them rather than
	// letting parseUint trim them.
	if len(b) == 0 || isSpace(b[0]) || isSpace(b[len(b)-1]) {
		return 0, errSyntax
	}
	v, err := parseUint(b)
	if err != nil {
		return 0, err
	}
	if v > maxCPUSetIndex {
		return 0, errRange
	}
	return int(v), nil
}
