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
