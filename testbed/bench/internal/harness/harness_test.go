// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
// sandbox path (this machine's layout), a hybrid host, and pure v2.
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
}
