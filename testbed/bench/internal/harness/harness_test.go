// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseGoroutineTotal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"goroutine profile: total 137\n42 @ 0x43e1ce 0x44f2a5\n#\t0x43e1cd\truntime.gopark+0xcd\n", 137, true},
		{"goroutine profile: total 5\r\n", 5, true},
		{"goroutine profile: total 0", 0, true}, // no newline: EOF after the line
		{"goroutine profile: total  12 \n", 12, true},
		{"", 0, false},
		{"\n", 0, false},
		{"goroutine profile: total\n", 0, false},
		{"goroutine profile: total -3\n", 0, false},
		{"goroutine profile: total 1e3\n", 0, false},
		{"goroutine profile: total 99999999999999999999999\n", 0, false},
		{"goroutine 1 [running]:\nmain.main()\n", 0, false}, // debug=2
		{"<html>404 page not found</html>\n", 0, false},
		{"\x1f\x8b\x08\x00binary", 0, false}, // debug=0: gzipped protobuf
		{strings.Repeat("x", 10000), 0, false},
	} {
		n, err := parseGoroutineTotal(strings.NewReader(tc.in))
		if tc.ok {
			require.NoError(t, err, "%q", tc.in)
			assert.Equal(t, tc.want, n, "%q", tc.in)
		} else {
			assert.Error(t, err, "%q", tc.in)
		}
	}
}

// TestResolve: v1 with cpu and cpuacct mounted apart and memory under a
// sandbox path (this machine's layout), a hybrid host, and pure v2 with and
// without the controllers a child needs.
func TestResolve(t *testing.T) {
	root := t.TempDir()
	put := func(p, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte(s), 0o644))
	}
	put("proc/self/mountinfo", `30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpuacct
33 25 0:29 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
38 25 0:34 / /sys/fs/cgroup/unified rw,relatime shared:17 - cgroup2 cgroup2 rw
`)
	put("proc/self/cgroup", "4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n")
	put("sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712\n")
	v, cpu, acct, mem, err := Resolve(root)
	require.NoError(t, err)
	assert.Equal(t, 1, v)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/cpu"), cpu)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/cpuacct"), acct)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/memory/process_api/abc"), mem)

	root = t.TempDir()
	put("proc/self/mountinfo", "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
	put("proc/self/cgroup", "0::/user.slice/s.scope\n")
	put("sys/fs/cgroup/user.slice/s.scope/cgroup.controllers", "cpuset cpu io memory pids\n")
	v, cpu, _, mem, err = Resolve(root)
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/user.slice/s.scope"), cpu)
	assert.Equal(t, cpu, mem)

	put("sys/fs/cgroup/user.slice/s.scope/cgroup.controllers", "cpuset io memory pids\n")
	_, _, _, _, err = Resolve(root)
	require.Error(t, err, "no cpu controller for a child")
}

func TestParseHostCPU(t *testing.T) {
	f := func(line string, want HostCPU, wantErr bool) {
		t.Helper()
		got, err := parseHostCPU(line)
		if wantErr {
			assert.Error(t, err, line)
			return
		}
		require.NoError(t, err, line)
		assert.Equal(t, want, got, line)
	}
	f("cpu  100 5 50 800 20 3 2 10 7 0", HostCPU{Busy: 170, Total: 990}, false) // guest (7) is in user already
	f("cpu 1 2 3 4", HostCPU{}, true)                                           // too few fields
	f("cpu0 1 2 3 4 5 6 7 8", HostCPU{}, true)                                  // a core's line, not the machine's
	f("cpu 1 2 x 4 5", HostCPU{}, true)
	f("cpu 10 0 10 70 10", HostCPU{Busy: 20, Total: 100}, false) // old kernels: no irq, softirq, steal

	assert.InDelta(t, 50, HostCPU{Busy: 70, Total: 200}.BusyPct(HostCPU{Busy: 20, Total: 100}), 1e-9)
	assert.EqualValues(t, -1, HostCPU{Busy: 20, Total: 100}.BusyPct(HostCPU{Busy: 20, Total: 100}), "no time passed")
}

// Terminate tells a process that ends on SIGTERM from one that has to be
// killed after the grace, and does not restart either.
func TestTerminate(t *testing.T) {
	// start runs script and waits until it has said ready: its traps are
	// set before the SIGTERM.
	start := func(script string) *Process {
		log := filepath.Join(t.TempDir(), "log.txt")
		p, err := StartProcess(ProcessConfig{
			Bin: "/bin/sh", Args: []string{"-c", script + "; echo ready; exec sleep 30"},
			LogPath: log, Restart: true, RestartDelay: time.Millisecond,
		})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			b, _ := os.ReadFile(log)
			return strings.Contains(string(b), "ready")
		}, 10*time.Second, 10*time.Millisecond)
		return p
	}
	graceful := start("true")
	_, killed := graceful.Terminate(20 * time.Second)
	assert.False(t, killed, "sleep ends on SIGTERM")

	stubborn := start(`trap "" TERM`)
	took, killed := stubborn.Terminate(300 * time.Millisecond)
	assert.True(t, killed, "a process that ignores SIGTERM is killed after the grace")
	assert.GreaterOrEqual(t, took, 300*time.Millisecond)
	_, alive, restarts := stubborn.State()
	assert.False(t, alive)
	assert.Zero(t, restarts, "a terminated process is not restarted")

	again, killed := stubborn.Terminate(time.Second)
	assert.Zero(t, again, "terminating a stopped process takes nothing")
	assert.False(t, killed)
}
