// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProcessFixture(t *testing.T) {
	p := NewProcess("testdata/process")
	t.Cleanup(func() { _ = p.Close() })

	assert.Equal(t, "process (/proc/self/stat)", p.Describe())
	cpu, err := p.CPUTime()
	require.NoError(t, err)
	// utime 250 + stime 50 ticks of 10 ms; the command name "(otel col) (x)"
	// holds spaces and parentheses.
	assert.Equal(t, 3*time.Second, cpu)

	ws, err := p.WorkingSet()
	require.NoError(t, err)
	assert.EqualValues(t, 2560*os.Getpagesize(), ws)

	l, err := p.Limits()
	require.NoError(t, err)
	assert.Equal(t, Limits{}, l)

	allocs := testing.AllocsPerRun(100, func() {
		_, _ = p.CPUTime()
		_, _ = p.WorkingSet()
	})
	assert.Zero(t, allocs)
}

// TestProcessNoStatm: without /proc/self/statm there is no current resident
// set, and the memory reading is reported missing (ErrNoMemory) rather than
// taken from getrusage's peak, which never falls.
func TestProcessNoStatm(t *testing.T) {
	p := NewProcess("testdata/process-no-statm")
	t.Cleanup(func() { _ = p.Close() })
	assert.Equal(t, "process (/proc/self/stat, no memory reading)", p.Describe())
	cpu, err := p.CPUTime()
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, cpu)
	ws, err := p.WorkingSet()
	require.ErrorIs(t, err, ErrNoMemory)
	assert.Contains(t, err.Error(), "/proc/self/statm")
	assert.Zero(t, ws)
}

func TestProcessGetrusage(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "wasip1" || runtime.GOOS == "js" {
		t.Skip("no getrusage on " + runtime.GOOS)
	}
	// No /proc under this root: getrusage is used for CPU, and there is no
	// memory reading.
	p := NewProcess(t.TempDir())
	assert.Equal(t, "process (getrusage, no memory reading)", p.Describe())
	// Burn a little CPU so the counter is not 0 at the resolution of the
	// platform's accounting.
	before, err := p.CPUTime()
	require.NoError(t, err)
	for {
		now, err := p.CPUTime()
		require.NoError(t, err)
		if now > before {
			break
		}
	}
	_, err = p.WorkingSet()
	require.ErrorIs(t, err, ErrNoMemory)
}

func TestProcessRealProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc on this machine")
	}
	p := NewProcess("/")
	t.Cleanup(func() { _ = p.Close() })
	assert.Equal(t, "process (/proc/self/stat)", p.Describe())
	_, err := p.CPUTime()
	require.NoError(t, err)
	ws, err := p.WorkingSet()
	require.NoError(t, err)
	assert.Positive(t, ws)
}

func TestProcessBadInput(t *testing.T) {
	tests := []struct {
		name          string
		stat, statm   string
		cpuErr, wsErr string
	}{
		{name: "no command name", stat: "1 S 2 3", statm: "1 2", cpuErr: "no command name"},
		{name: "truncated stat", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 25", statm: "1 2", cpuErr: "too few fields"},
		{name: "garbage utime", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 2x 5 0", statm: "1 2", cpuErr: "utime"},
		{name: "negative stime", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 2 -5 0", statm: "1 2", cpuErr: "stime"},
		{name: "statm one field", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 2 5", statm: "1\n", wsErr: "too few fields"},
		{name: "statm garbage", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 2 5", statm: "1 z", wsErr: "invalid number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(root, "proc/self"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(root, "proc/self/stat"), []byte(tt.stat), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(root, "proc/self/statm"), []byte(tt.statm), 0o644))
			p := NewProcess(root)
			t.Cleanup(func() { _ = p.Close() })
			_, err := p.CPUTime()
			checkErr(t, err, nonEmpty(tt.cpuErr, "proc/self/stat"))
			_, err = p.WorkingSet()
			checkErr(t, err, nonEmpty(tt.wsErr, "proc/self/statm"))
		})
	}
}

// nonEmpty returns {want, path} when want is set, nil (no error) otherwise.
func nonEmpty(want, path string) []string {
	if want == "" {
		return nil
	}
	return []string{want, path}
}

func BenchmarkProcessCPUTime(b *testing.B) {
	p := NewProcess("testdata/process")
	b.Cleanup(func() { _ = p.Close() })
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.CPUTime(); err != nil {
			b.Fatal(err)
		}
	}
}
