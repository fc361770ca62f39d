// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"
)

// clockTicks is USER_HZ, the unit of the utime and stime fields of
// /proc/<pid>/stat. It is part of the kernel's user-space ABI and is 100 on
// every Linux architecture Go supports, whatever CONFIG_HZ is (it is what
// sysconf(_SC_CLK_TCK) returns), so it is a constant here rather than a cgo
// call.
const clockTicks = 100

// Process is the fallback Source where there is no cgroup (bare metal,
// macOS, tests): it reads the process's own CPU time and resident memory.
//
// CPU time comes from <root>/proc/self/stat (utime + stime, in clock ticks of
// 1/100 s) or, where that file does not exist, from getrusage(RUSAGE_SELF).
// The working set is the resident set from <root>/proc/self/statm times the
// page size. Where that file does not exist (macOS, the BSDs) there is no
// memory reading: WorkingSet returns an error wrapping ErrNoMemory rather
// than getrusage's ru_maxrss, because that is the peak resident set, which
// never falls, and would hold the memory signal above its lines for good
// after one spike. Limits is always the zero Limits: the sampler applies
// fallback_cores and memory_limit_mib.
//
// Like Reader, a Process is used from one goroutine and reuses its buffer.
type Process struct {
	stat, statm hotFile
	statShown   string
	statmShown  string
	useStat     bool
	useStatm    bool
	buf         []byte
}

// NewProcess returns the process fallback reading <root>/proc/self/stat and
// statm when they exist (root "/" in production), getrusage otherwise. The
// choice is made once here so Describe names the source actually used.
func NewProcess(root string) *Process {
	if root == "" {
		root = "/"
	}
	p := &Process{
		statShown:  "/proc/self/stat",
		statmShown: "/proc/self/statm",
	}
	p.stat.setPath(joinRoot(root, p.statShown))
	p.statm.setPath(joinRoot(root, p.statmShown))
	_, err := os.Stat(p.stat.path)
	p.useStat = err == nil
	_, err = os.Stat(p.statm.path)
	p.useStatm = err == nil
	return p
}

func joinRoot(root, p string) string {
	return filepath.Join(root, filepath.FromSlash(p))
}

// CPUTime returns the process's cumulative user + system CPU time.
func (p *Process) CPUTime() (time.Duration, error) {
	if !p.useStat {
		return rusageCPU()
	}
	b, err := p.stat.read(&p.buf)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	ticks, err := parseProcStat(b)
	if err != nil {
		return 0, parseError(p.stat.path, b, err)
	}
	if ticks > math.MaxInt64/uint64(time.Second/clockTicks) {
		return 0, parseError(p.stat.path, b, errRange)
	}
	return time.Duration(ticks) * (time.Second / clockTicks), nil
}

// errNoStatm is what WorkingSet returns without /proc/self/statm.
var errNoStatm = fmt.Errorf("%w: no /proc/self/statm to read the current resident set from", ErrNoMemory)

// WorkingSet returns the process's resident set in bytes, or an error
// wrapping ErrNoMemory where there is no /proc/self/statm (see Process).
func (p *Process) WorkingSet() (uint64, error) {
	if !p.useStatm {
		return 0, errNoStatm
	}
	b, err := p.statm.read(&p.buf)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	pages, err := parseStatm(b)
	if err != nil {
		return 0, parseError(p.statm.path, b, err)
	}
	ps := uint64(os.Getpagesize()) //nolint:gosec // G115: the page size is positive
	if pages > math.MaxUint64/ps {
		return 0, parseError(p.statm.path, b, errRange)
	}
	return pages * ps, nil
}

// Limits returns the zero Limits: a process outside a cgroup has no quota or
// limit to read; the sampler falls back to its configuration.
func (p *Process) Limits() (Limits, error) { return Limits{}, nil }

// Describe names the source, e.g. "process (/proc/self/stat)".
func (p *Process) Describe() string {
	switch {
	case p.useStat && p.useStatm:
		return "process (" + p.statShown + ")"
	case p.useStat:
		return "process (" + p.statShown + ", no memory reading)"
	case p.useStatm:
		return "process (getrusage, memory from " + p.statmShown + ")"
	}
	return "process (getrusage, no memory reading)"
}

// Close closes the files kept open between reads.
func (p *Process) Close() error {
	p.stat.close()
	p.statm.close()
	return nil
}

var errStatFields = errors.New("too few fields")

// parseProcStat returns utime + stime (fields 14 and 15, proc(5)) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may itself hold spaces and ')', so fields are counted after the last ')'.
func parseProcStat(data []byte) (uint64, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name: %w", errSyntax)
	}
	// After ')' come field 3 (state) onwards; utime is field 14.
	var utime, stime []byte
	rest := data[i+1:]
	for field := 3; field <= 15; field++ {
		var f []byte
		f, rest = nextField(rest)
		if f == nil {
			return 0, errStatFields
		}
		switch field {
		case 14:
			utime = f
		case 15:
			stime = f
		}
	}
	u, err := parseUint(utime)
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	s, err := parseUint(stime)
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	if u > math.MaxUint64-s {
		return 0, errRange
	}
	return u + s, nil
}

// parseStatm returns the resident field (the second, in pages) of
// /proc/<pid>/statm.
func parseStatm(data []byte) (uint64, error) {
	_, rest := nextField(data)
	f, _ := nextField(rest)
	if f == nil {
		return 0, errStatFields
	}
	return parseUint(f)
}

// nextField returns the next space-separated field of b (nil when none) and
// what follows it.
func nextField(b []byte) (field, rest []byte) {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	if len(b) == 0 {
		return nil, nil
	}
	j := 0
	for j < len(b) && !isSpace(b[j]) {
		j++
	}
	return b[:j], b[j:]
}
