// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// LoadAvg is the machine's 1-minute load average ("" when unknown).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return ""
}

// MachineInfo describes the machine, the commit and the command of a run,
// for the report (machine.txt, whose lines ParseRunInfo reads back).
func MachineInfo(args []string) string {
	var b strings.Builder
	line := func(label, format string, a ...any) {
		fmt.Fprintf(&b, "%-12s%s\n", label, fmt.Sprintf(format, a...))
	}
	line(labelDate, "%s", time.Now().UTC().Format(time.RFC3339))
	line("cpus", "%d online (nproc)", runtime.NumCPU())
	model := "unknown"
	if ci, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(ci), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	line("cpu model", "%s", model)
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		line("kernel", "Linux %s", strings.TrimSpace(string(k)))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		line("load avg", "%s (at the start of the run)", strings.TrimSpace(string(la)))
	}
	line("go", "%s", runtime.Version())
	line(labelCommit, "%s", Commit())
	line(labelCommand, "%s", commandLine(args))
	return b.String()
}

// commandLine is args as a shell would take them back, run again from the
// working folder (the repository's root, for the make targets): the
// program as it was named from there (the base name when go run or go test
// built it elsewhere), an argument that is a path below it (alone or after
// "-flag=") relative to it, every argument quoted when it needs to be.
func commandLine(args []string) string {
	if len(args) == 0 {
		return ""
	}
	wd, _ := os.Getwd()
	prog := filepath.Base(args[0])
	if rel, ok := below(wd, args[0]); ok {
		prog = rel
	} else if !filepath.IsAbs(args[0]) && !strings.HasPrefix(args[0], "..") {
		prog = args[0]
	}
	out := []string{prog}
	for _, a := range args[1:] {
		if flag, path, ok := strings.Cut(a, "="); ok && strings.HasPrefix(flag, "-") {
			if rel, ok := below(wd, path); ok {
				a = flag + "=" + rel
			}
		} else if rel, ok := below(wd, a); ok {
			a = rel
		}
		out = append(out, shellQuote(a))
	}
	return strings.Join(out, " ")
}

// below is the absolute path p relative to dir, when p is below it.
func below(dir, p string) (string, bool) {
	if dir == "" || !filepath.IsAbs(p) {
		return "", false
	}
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", false
	}
	return rel, true
}

// shellQuote quotes s for a POSIX shell when it holds anything but plain
// characters.
func shellQuote(s string) string {
	plain := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=,:@+%", r)
	}
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool { return !plain(r) }) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// ProcCounts returns the OS threads and open file descriptors of pid (-1
// when unreadable).
func ProcCounts(pid int) (threads, fds float64) {
	threads, fds = -1, -1
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Threads:"); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					threads = float64(n)
				}
			}
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		fds = float64(len(ents))
	}
	return threads, fds
}

// HostCPU is the machine's CPU time from /proc/stat, in clock ticks over
// all its cores: what every process on it used (Busy) and in all (Total).
type HostCPU struct{ Busy, Total uint64 }

// ReadHostCPU reads the machine's CPU time from procStat (/proc/stat).
func ReadHostCPU(procStat string) (HostCPU, error) {
	b, err := os.ReadFile(procStat)
	if err != nil {
		return HostCPU{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseHostCPU(line)
}

// parseHostCPU parses the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is already in user); idle and
// iowait are not busy.
func parseHostCPU(line string) (HostCPU, error) {
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return HostCPU{}, fmt.Errorf("not the cpu line of /proc/stat: %q", line)
	}
	var c HostCPU
	for i, s := range f[1:min(len(f), 9)] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return HostCPU{}, fmt.Errorf("/proc/stat cpu field %d: %w", i+1, err)
		}
		c.Total += v
		if i != 3 && i != 4 { // idle, iowait
			c.Busy += v
		}
	}
	return c, nil
}

// BusyPct is how busy the machine was between prev and c, in % of all its
// cores; -1 when no time passed.
func (c HostCPU) BusyPct(prev HostCPU) float64 {
	if c.Total <= prev.Total || c.Busy < prev.Busy {
		return -1
	}
	return 100 * float64(c.Busy-prev.Busy) / float64(c.Total-prev.Total)
}
