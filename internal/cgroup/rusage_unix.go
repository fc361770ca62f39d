//go:build unix

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"fmt"
	"runtime"
	"syscall"
	"time"
)

func rusageCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("cgroup: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// rusageMaxRSS returns the peak resident set size in bytes. ru_maxrss is in
// bytes on Darwin and in KiB elsewhere (Linux, the BSDs).
func rusageMaxRSS() (uint64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("cgroup: getrusage: %w", err)
	}
	rss := uint64(ru.Maxrss) //nolint:gosec,unconvert // never negative; int32 on some platforms
	if runtime.GOOS != "darwin" && runtime.GOOS != "ios" {
		rss *= 1024
	}
	return rss, nil
}
