// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package cgroup

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
)

const (
	helperEnv    = "THROTTLE_CGROUP_HELPER"
	helperPrefix = "CGROUP_HELPER_RESULT "
	testMemLimit = 256 << 20
)

// helperResult is what the child process reports from inside the cgroup.
type helperResult struct {
	Describe string
	Version  int
	Limits   Limits
	CPUTime  time.Duration
	CPUErr   string
	WSErr    string
	Err      string
}

// TestHelperProcess is not a test: TestRealMachine runs the test binary
// again with helperEnv set, moves it into the cgroups it created, closes its
// stdin, and this function then reads the cgroup with NewReader("/") and
// prints the result.
// spin is written by the helper's busy loop so the loop is not optimised away.
var spin uint64

func TestHelperProcess(*testing.T) {
	if os.Getenv(helperEnv) != "1" {
		return
	}
	// Wait until the parent has moved this process into the cgroups.
	_, _ = io.Copy(io.Discard, os.Stdin)
	// Burn some CPU inside the new cgroup, whose cpuacct counter starts at 0
	// when the process is moved in, so that the reader has usage to see.
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		spin++
	}
	var res helperResult
	r, err := NewReader("/")
	if err != nil {
		res.Err = err.Error()
	} else {
		res.Describe, res.Version = r.Describe(), r.Version()
		if res.Limits, err = r.Limits(); err != nil {
			res.Err = err.Error()
		}
		if res.CPUTime, err = r.CPUTime(); err != nil {
			res.CPUErr = err.Error()
		}
		if _, err = r.WorkingSet(); err != nil {
			res.WSErr = err.Error()
		}
	}
	b, _ := json.Marshal(res)
	fmt.Printf("\n%s%s\n", helperPrefix, b)
}

// TestRealMachine creates child cgroups with a 0.5-core quota and a 256 MiB
// limit on this machine, runs a child process inside them and checks that
// the Reader, run there, reports those limits. It needs Linux, root and a
// writable cgroup hierarchy; without root or a writable hierarchy it skips
// (fails under CI).
func TestRealMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("cgroups exist on Linux only")
	}
	if os.Geteuid() != 0 {
		e2eskip.Missing(t, "creating cgroups needs root: run make e2e as root")
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	pc, err := os.ReadFile("/proc/self/cgroup")
	require.NoError(t, err)
	mounts, err := parseMountinfo(mi)
	require.NoError(t, err)
	lines, err := parseProcCgroup(pc)
	require.NoError(t, err)

	unique := fmt.Sprintf("throttle-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	var procs []string // cgroup.procs files to move the child into
	hasV1 := false
	for _, m := range mounts {
		hasV1 = hasV1 || (!m.v2 && (m.has("cpu") || m.has("cpuacct")))
	}
	if hasV1 {
		procs = setupV1(t, mounts, lines, unique)
	} else {
		procs = setupV2(t, mounts, lines, unique)
	}

	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	exited := false
	t.Cleanup(func() {
		if !exited {
			// Only the process this test started.
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	for _, p := range procs {
		require.NoError(t, os.WriteFile(p, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644), "moving the child into %s", p)
	}
	require.NoError(t, stdin.Close())
	err = cmd.Wait()
	exited = true
	require.NoError(t, err, "helper stderr: %s\nstdout: %s", stderr.String(), stdout.String())

	var res helperResult
	found := false
	for _, line := range strings.Split(stdout.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, helperPrefix); ok {
			require.NoError(t, json.Unmarshal([]byte(rest), &res))
			found = true
		}
	}
	require.True(t, found, "no result from the helper: %s", stdout.String())
	t.Logf("child: %+v", res)
	require.Empty(t, res.Err)
	assert.Empty(t, res.CPUErr)
	assert.Empty(t, res.WSErr)
	assert.Contains(t, res.Describe, unique)
	assert.InDelta(t, 0.5, res.Limits.QuotaCores, 1e-9)
	assert.Equal(t, uint64(testMemLimit), res.Limits.MemLimit)
	assert.Positive(t, res.CPUTime)
}

// mkCgroup creates dir and removes it when the test ends (after the child
// has exited: cleanups run last-in first-out and the child's is registered
// later).
func mkCgroup(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		e2eskip.Missing(t, "cannot create a cgroup (a writable cgroup hierarchy is needed): %v", err)
	}
	t.Cleanup(func() {
		// The kernel may take a moment to drop the exited child from the
		// cgroup; rmdir fails with EBUSY until then.
		assert.Eventually(t, func() bool {
			err := os.Remove(dir)
			return err == nil || errors.Is(err, os.ErrNotExist)
		}, 5*time.Second, 10*time.Millisecond, "removing %s", dir)
	})
}

func writeCgroupFile(t *testing.T, dir, file, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
		t.Skipf("cannot configure the cgroup: %v", err)
	}
}

// skipIfTighter skips when a level above dir already holds a tighter limit
// than the test sets, so the expected numbers would not be the binding ones.
func skipIfTighter(t *testing.T, mountPoint, dir, file string, parse func([]byte) (float64, error), limit float64) {
	t.Helper()
	for d := path.Dir(dir); strings.HasPrefix(d, mountPoint); d = path.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, file)); err == nil {
			if v, err := parse(b); err == nil && v > 0 && v < limit {
				t.Skipf("%s/%s is already tighter (%v) than the test's %v", d, file, v, limit)
			}
		}
		if d == mountPoint || d == "/" {
			return
		}
	}
}

func setupV1(t *testing.T, mounts []mount, lines []procCgroup, unique string) []string {
	dirs := map[string]string{}
	var procs []string
	for _, c := range []string{"cpu", "cpuacct", "memory"} {
		p, ok := v1Path(lines, c)
		if !ok {
			t.Skipf("no /proc/self/cgroup line for the v1 %s controller", c)
		}
		m, ok := findV1Mount(mounts, c, p)
		if !ok {
			t.Skipf("no mount for the v1 %s controller", c)
		}
		rel, ok := relPath(m.root, p)
		if !ok {
			t.Skipf("own %s cgroup %s is not under its mount's root %s", c, p, m.root)
		}
		// Nested under the process's own cgroup, as a container runtime would.
		dir := path.Join(m.point, rel, unique)
		if _, done := dirs[dir]; !done {
			mkCgroup(t, dir)
			procs = append(procs, filepath.Join(dir, "cgroup.procs"))
		}
		dirs[dir] = c
		switch c {
		case "cpu":
			skipIfTighter(t, m.point, dir, "cpu.cfs_quota_us", func(b []byte) (float64, error) {
				q, _, err := parseV1Quota(b)
				return float64(q) / 100000, err
			}, 0.5)
			writeCgroupFile(t, dir, "cpu.cfs_period_us", "100000")
			writeCgroupFile(t, dir, "cpu.cfs_quota_us", "50000")
		case "memory":
			skipIfTighter(t, m.point, dir, "memory.limit_in_bytes", func(b []byte) (float64, error) {
				v, err := parseV1MemoryLimit(b)
				return float64(v), err
			}, testMemLimit)
			writeCgroupFile(t, dir, "memory.limit_in_bytes", strconv.Itoa(testMemLimit))
		}
	}
	return procs
}

func setupV2(t *testing.T, mounts []mount, lines []procCgroup, unique string) []string {
	p, ok := v2Path(lines)
	if !ok {
		t.Skip("no cgroup v1 CPU controller and no v2 line in /proc/self/cgroup")
	}
	m, ok := findV2Mount(mounts, p)
	if !ok {
		t.Skip("no cgroup2 mount")
	}
	rel, ok := relPath(m.root, p)
	if !ok {
		t.Skipf("own cgroup %s is not under the mount's root %s", p, m.root)
	}
	parent := path.Join(m.point, rel)
	ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
	if err != nil {
		t.Skipf("cannot read the subtree controllers: %v", err)
	}
	if !strings.Contains(string(ctl), "cpu") || !strings.Contains(string(ctl), "memory") {
		// Fails with EBUSY when the parent holds processes and is not the
		// root ("no internal processes"); the test then skips.
		writeCgroupFile(t, parent, "cgroup.subtree_control", "+cpu +memory")
	}
	dir := path.Join(parent, unique)
	mkCgroup(t, dir)
	writeCgroupFile(t, dir, "cpu.max", "50000 100000")
	writeCgroupFile(t, dir, "memory.max", strconv.Itoa(testMemLimit))
	return []string{filepath.Join(dir, "cgroup.procs")}
}
