// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runMemPulse is the memory pulse of scenario a: a process the driver
// places in the gateway's memory cgroup (and no other controller), which
// maps and touches memory until the cgroup's working set reaches -target
// of its limit, holds it there for -hold, and exits, releasing it. The
// gateway's throttle sees the working set of its cgroup, so its memory
// lines open as they would for a burst of its own.
func runMemPulse(args []string) error {
	fs := flag.NewFlagSet("mempulse", flag.ContinueOnError)
	dir := fs.String("mem-dir", "", "the memory cgroup's directory")
	target := fs.Float64("target", 0.95, "working set to reach, share of the cgroup's memory limit")
	hold := fs.Duration("hold", 3*time.Second, "how long the working set is held at the target")
	chunkMiB := fs.Int("chunk-mib", 4, "MiB mapped at a time")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *target <= 0 || *target >= 1 || *chunkMiB < 1 {
		return errors.New("-mem-dir is needed, -target in (0, 1), -chunk-mib >= 1")
	}
	mem := memFiles(*dir)
	chunk := *chunkMiB << 20
	var held [][]byte
	release := func() {
		last := held[len(held)-1]
		held = held[:len(held)-1]
		_ = syscall.Munmap(last)
	}
	defer func() {
		for len(held) > 0 {
			release()
		}
	}()
	grab := func() error {
		b, err := syscall.Mmap(-1, 0, chunk, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return err
		}
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		return nil
	}
	// Up to the target, then hold it there: the gateway's own memory moves
	// while the pulse lasts, and an overshoot would meet the OOM killer.
	start := time.Now()
	var reached time.Time
	for {
		share, err := mem.share()
		if err != nil {
			return err
		}
		switch {
		case share < *target:
			if err := grab(); err != nil {
				return err
			}
		case share > *target+0.02 && len(held) > 0:
			release()
		default:
			if reached.IsZero() {
				reached = time.Now()
				fmt.Fprintf(os.Stderr, "mempulse: %d MiB mapped, working set %.1f%% of the limit after %s; holding %s\n",
					len(held)*(*chunkMiB), 100*share, time.Since(start).Round(time.Millisecond), *hold)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !reached.IsZero() && time.Since(reached) >= *hold {
			return nil
		}
		if reached.IsZero() && time.Since(start) > 10*time.Second {
			return fmt.Errorf("working set %.1f%% of the limit after 10s, target %.1f%%", 100*share, 100**target)
		}
	}
}

// memFiles reads a memory cgroup's working set and limit (v1 or v2).
type memFiles string

func (d memFiles) share() (float64, error) {
	dir := string(d)
	read := func(name string) (uint64, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return math.MaxUint64, nil
		}
		return strconv.ParseUint(s, 10, 64)
	}
	stat := func(key string) uint64 {
		b, _ := os.ReadFile(filepath.Join(dir, "memory.stat"))
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok && k == key {
				n, _ := strconv.ParseUint(v, 10, 64)
				return n
			}
		}
		return 0
	}
	usage, err := read("memory.usage_in_bytes") // v1
	limitFile, inactive := "memory.limit_in_bytes", "total_inactive_file"
	if err != nil {
		if usage, err = read("memory.current"); err != nil { // v2
			return 0, err
		}
		limitFile, inactive = "memory.max", "inactive_file"
	}
	limit, err := read(limitFile)
	if err != nil {
		return 0, err
	}
	ws := usage - min(usage, stat(inactive))
	return float64(ws) / float64(limit), nil
}

// spin keeps a core busy from t0 for busy.
func spin(t0 time.Time, busy time.Duration) {
	for n := 0; time.Since(t0) < busy; n++ {
		_ = n
	}
}

// runCPUBurn is the CPU load of scenario b: a process the driver places in
// the gateway's CPU cgroup (and no other controller), busy -cores of a core
// (in 10 ms slices) for -duration, so that the gateway's CPU level stays
// above lines set under its quota and the throttle holds Open that long.
func runCPUBurn(args []string) error {
	fs := flag.NewFlagSet("cpuburn", flag.ContinueOnError)
	cores := fs.Float64("cores", 0.4, "cores kept busy")
	duration := fs.Duration("duration", 60*time.Second, "how long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cores <= 0 || *duration <= 0 {
		return errors.New("-cores and -duration must be > 0")
	}
	const slice = 10 * time.Millisecond
	end := time.Now().Add(*duration)
	n := int(math.Ceil(*cores))
	per := *cores / float64(n)
	runtime.GOMAXPROCS(n + 1)
	done := make(chan struct{})
	for range n {
		go func() {
			busy := time.Duration(per * float64(slice))
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					done <- struct{}{}
					return
				}
				spin(t0, busy)
				time.Sleep(slice - time.Since(t0))
			}
		}()
	}
	for range n {
		<-done
	}
	return nil
}
