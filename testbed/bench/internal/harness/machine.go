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

// MachineInfo describes the machine and the command of a run, for the
// report (machine.txt).
func MachineInfo(args []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "date (UTC)  %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "cpus        %d online (nproc)\n", runtime.NumCPU())
	model := "unknown"
	if ci, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(ci), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	fmt.Fprintf(&b, "cpu model   %s\n", model)
	if k, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		fmt.Fprintf(&b, "kernel      Linux %s\n", strings.TrimSpace(string(k)))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "load avg    %s (at the start of the run)\n", strings.TrimSpace(string(la)))
	}
	fmt.Fprintf(&b, "go          %s\n", runtime.Version())
	if len(args) > 0 {
		// go run and go test build into a temporary folder: the name is
		// what matters.
		args = append([]string{filepath.Base(args[0])}, args[1:]...)
	}
	fmt.Fprintf(&b, "command     %s\n", strings.Join(args, " "))
	return b.String()
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
