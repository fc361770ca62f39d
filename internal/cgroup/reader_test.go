// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

// TestReaderFixtures reads each fixture tree under testdata and checks every
// value the Reader reports. The trees are described in testdata/README.md.
func TestReaderFixtures(t *testing.T) {
	tests := []struct {
		name       string
		version    int
		describe   string
		cpu        time.Duration
		workingSet uint64
		wsErr      error
		limits     Limits
	}{
		{
			name:       "v2-container",
			version:    2,
			describe:   "cgroup v2 /sys/fs/cgroup",
			cpu:        123456789 * time.Microsecond,
			workingSet: 80 * mib,
			limits:     Limits{QuotaCores: 2.5, CPUSetCores: 4, MemLimit: 512 * mib},
		},
		{
			// "max" at the leaf, 4 cores at the pod; memory 2 GiB at the leaf,
			// 1 GiB at the pod, 8 GiB above: the pod's values bind.
			name:       "v2-host",
			version:    2,
			describe:   "cgroup v2 /sys/fs/cgroup/kubepods/burstable/pod1/ctr",
			cpu:        5 * time.Second,
			workingSet: 200 * mib,
			limits:     Limits{QuotaCores: 4, CPUSetCores: 4, MemLimit: gib},
		},
		{
			name:    "v1-separate",
			version: 1,
			describe: "cgroup v1 cpu=/sys/fs/cgroup/cpu cpuacct=/sys/fs/cgroup/cpuacct " +
				"cpuset=/sys/fs/cgroup/cpuset memory=/sys/fs/cgroup/memory/process_api/abc",
			cpu:        2500 * time.Millisecond,
			workingSet: 96 * mib, // total_inactive_file, not inactive_file
			limits:     Limits{QuotaCores: 1.5, CPUSetCores: 2, MemLimit: 256 * mib},
		},
		{
			name:    "v1-combined",
			version: 1,
			describe: "cgroup v1 cpu=/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr " +
				"cpuacct=/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr " +
				"cpuset=/sys/fs/cgroup/cpuset/kubepods/pod1/ctr memory=/sys/fs/cgroup/memory/kubepods/pod1/ctr",
			cpu:        7 * time.Second,
			workingSet: 150 * mib,
			// The leaf's cpuset.cpus is empty (never set): the parent's 0-7 binds.
			limits: Limits{QuotaCores: 2, CPUSetCores: 8, MemLimit: 512 * mib},
		},
		{
			// Container view with mount root /docker/abc; -1 quota and the
			// 9223372036854771712 sentinel mean no limit. inactive > usage
			// clamps the working set to 0.
			name:    "v1-unlimited",
			version: 1,
			describe: "cgroup v1 cpu=/sys/fs/cgroup/cpu,cpuacct cpuacct=/sys/fs/cgroup/cpu,cpuacct " +
				"cpuset=/sys/fs/cgroup/cpuset memory=/sys/fs/cgroup/memory",
			cpu:        12345,
			workingSet: 0,
			limits:     Limits{QuotaCores: 0, CPUSetCores: 9, MemLimit: 0},
		},
		{
			// The unified hierarchy has no controllers: v1 is used, its
			// cpu.stat (usage 1 µs) is never read.
			name:    "hybrid",
			version: 1,
			describe: "cgroup v1 cpu=/sys/fs/cgroup/cpu,cpuacct/system.slice/otelcol.service " +
				"cpuacct=/sys/fs/cgroup/cpu,cpuacct/system.slice/otelcol.service " +
				"cpuset=/sys/fs/cgroup/cpuset memory=/sys/fs/cgroup/memory/system.slice/otelcol.service",
			cpu:        3 * time.Second,
			workingSet: 300 * mib,
			limits:     Limits{QuotaCores: 0.5, CPUSetCores: 4, MemLimit: gib},
		},
		{
			// Limits reports both; the sampler's EffectiveCores takes the min.
			name:       "v2-cpuset-small",
			version:    2,
			describe:   "cgroup v2 /sys/fs/cgroup",
			cpu:        time.Millisecond,
			workingSet: mib,
			limits:     Limits{QuotaCores: 4, CPUSetCores: 2, MemLimit: 0},
		},
		{
			// mountinfo root /kubepods/pod1, process in /kubepods/pod1/ctr:
			// the directory is <mount point>/ctr, and the walk up reaches the
			// mount point (the pod) for the quota and memory limit.
			name:       "v2-mount-root",
			version:    2,
			describe:   "cgroup v2 /sys/fs/cgroup/ctr",
			cpu:        42 * time.Second,
			workingSet: 48 * mib,
			limits:     Limits{QuotaCores: 3, CPUSetCores: 8, MemLimit: gib},
		},
		{
			// /proc/self/cgroup names a directory that is not visible: the
			// mount point is the only choice left.
			name:       "v2-bind-leaf",
			version:    2,
			describe:   "cgroup v2 /sys/fs/cgroup (mount point: own cgroup not visible)",
			cpu:        9 * time.Second,
			workingSet: 30 * mib,
			limits:     Limits{QuotaCores: 1, CPUSetCores: 2, MemLimit: 128 * mib},
		},
		{
			// mountinfo holds a mount with an empty source (two spaces after
			// the type), escaped paths, many optional fields, a line without
			// the "-" field and a cgroup2 line with a relative root: the
			// odd lines are skipped and the good cgroup2 line is used.
			name:       "v2-odd-mountinfo",
			version:    2,
			describe:   "cgroup v2 /sys/fs/cgroup",
			cpu:        123456789 * time.Microsecond,
			workingSet: 80 * mib,
			limits:     Limits{QuotaCores: 2.5, CPUSetCores: 4, MemLimit: 512 * mib},
		},
		{
			name:     "v1-no-memory",
			version:  1,
			describe: "cgroup v1 cpu=/sys/fs/cgroup/cpu,cpuacct cpuacct=/sys/fs/cgroup/cpu,cpuacct cpuset=none memory=none",
			cpu:      5,
			wsErr:    ErrNoMemory,
			limits:   Limits{QuotaCores: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewReader(filepath.Join("testdata", tt.name))
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })

			assert.Equal(t, tt.version, r.Version())
			assert.Equal(t, tt.describe, r.Describe())

			cpu, err := r.CPUTime()
			require.NoError(t, err)
			assert.Equal(t, tt.cpu, cpu)

			ws, err := r.WorkingSet()
			if tt.wsErr != nil {
				require.ErrorIs(t, err, tt.wsErr)
			} else {
				require.NoError(t, err)
				assert.Equal(t, tt.workingSet, ws)
			}

			l, err := r.Limits()
			require.NoError(t, err)
			assert.Equal(t, tt.limits, l)
			// Limits re-resolves; the description must not change.
			assert.Equal(t, tt.describe, r.Describe())
		})
	}
}

func TestNewReaderNoCgroup(t *testing.T) {
	tests := []struct {
		name    string
		root    string
		message string
	}{
		{name: "no cgroup mounts", root: "testdata/none", message: "no cgroup mount with a cpu or cpuacct controller"},
		{name: "empty unified next to named v1", root: "testdata/hybrid-empty", message: "cpu.stat"},
		{name: "no proc", root: "testdata/does-not-exist", message: "mountinfo"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewReader(tt.root)
			require.ErrorIs(t, err, ErrNoCgroup)
			assert.Nil(t, r)
			assert.Contains(t, err.Error(), tt.message)
		})
	}
}

// copyTree copies a fixture tree into a temporary folder so a test can
// damage it.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	// CopyFS keeps read-only modes; tests rewrite files.
	require.NoError(t, filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chmod(p, 0o644)
	}))
	return dst
}

// edit applies file contents to a tree: a nil content removes the file.
func edit(t *testing.T, root string, files map[string]*string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if content == nil {
			require.NoError(t, os.Remove(p))
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(*content), 0o644))
	}
}

func s(v string) *string { return &v }

const (
	v2Dir    = "sys/fs/cgroup/"
	v1CPU    = "sys/fs/cgroup/cpu/"
	v1Acct   = "sys/fs/cgroup/cpuacct/"
	v1Memory = "sys/fs/cgroup/memory/process_api/abc/"
)

// TestLimitsBadInput: a bad file is skipped and named in the error; the
// limits read from the other files are still returned.
func TestLimitsBadInput(t *testing.T) {
	tests := []struct {
		name   string
		base   string
		files  map[string]*string
		want   Limits
		errors []string // substrings of the error; none = no error
	}{
		{
			name:   "v2 quota 0",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.max": s("0 100000\n")},
			want:   Limits{CPUSetCores: 4, MemLimit: 512 * mib},
			errors: []string{"cpu.max", "quota: must be > 0"},
		},
		{
			name:   "v2 period 0",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.max": s("100000 0\n")},
			want:   Limits{CPUSetCores: 4, MemLimit: 512 * mib},
			errors: []string{"cpu.max", "period: must be > 0"},
		},
		{
			name:   "v2 negative quota",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.max": s("-100000 100000\n")},
			want:   Limits{CPUSetCores: 4, MemLimit: 512 * mib},
			errors: []string{"cpu.max", "invalid number"},
		},
		{
			name:   "v2 partial cpu.max",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.max": s("150000")},
			want:   Limits{CPUSetCores: 4, MemLimit: 512 * mib},
			errors: []string{"cpu.max", `want "quota period"`},
		},
		{
			name:   "v2 garbage cpu.max",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.max": s("\x00\xffgarbage")},
			want:   Limits{CPUSetCores: 4, MemLimit: 512 * mib},
			errors: []string{"cpu.max"},
		},
		{
			name:   "v2 empty cpu.max",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.max": s("")},
			want:   Limits{CPUSetCores: 4, MemLimit: 512 * mib},
			errors: []string{"cpu.max"},
		},
		{
			name:  "v2 missing cpu.max and memory.max: no limit, no error",
			base:  "v2-container",
			files: map[string]*string{v2Dir + "cpu.max": nil, v2Dir + "memory.max": nil},
			want:  Limits{CPUSetCores: 4},
		},
		{
			name:   "v2 memory.max 0",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "memory.max": s("0\n")},
			want:   Limits{QuotaCores: 2.5, CPUSetCores: 4},
			errors: []string{"memory.max", "must be > 0"},
		},
		{
			name:   "v2 negative memory.max",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "memory.max": s("-1\n")},
			want:   Limits{QuotaCores: 2.5, CPUSetCores: 4},
			errors: []string{"memory.max"},
		},
		{
			name:   "v2 reversed cpuset range",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpuset.cpus.effective": s("3-1\n")},
			want:   Limits{QuotaCores: 2.5, MemLimit: 512 * mib},
			errors: []string{"cpuset.cpus.effective", "out of range"},
		},
		{
			name: "v2 bad pod level skipped, leaf and others kept",
			base: "v2-host",
			files: map[string]*string{
				v2Dir + "kubepods/burstable/pod1/cpu.max":    s("abc 100000\n"),
				v2Dir + "kubepods/burstable/pod1/memory.max": s("1GiB\n"),
			},
			want:   Limits{CPUSetCores: 4, MemLimit: 2 * gib},
			errors: []string{"pod1/cpu.max", "pod1/memory.max"},
		},
		{
			name:   "v1 quota 0",
			base:   "v1-separate",
			files:  map[string]*string{v1CPU + "cpu.cfs_quota_us": s("0\n")},
			want:   Limits{CPUSetCores: 2, MemLimit: 256 * mib},
			errors: []string{"cpu.cfs_quota_us", "must be > 0"},
		},
		{
			name:   "v1 negative quota other than -1",
			base:   "v1-separate",
			files:  map[string]*string{v1CPU + "cpu.cfs_quota_us": s("-2\n")},
			want:   Limits{CPUSetCores: 2, MemLimit: 256 * mib},
			errors: []string{"cpu.cfs_quota_us", "negative"},
		},
		{
			name:   "v1 period 0",
			base:   "v1-separate",
			files:  map[string]*string{v1CPU + "cpu.cfs_period_us": s("0\n")},
			want:   Limits{CPUSetCores: 2, MemLimit: 256 * mib},
			errors: []string{"cpu.cfs_period_us", "must be > 0"},
		},
		{
			name:   "v1 negative period",
			base:   "v1-separate",
			files:  map[string]*string{v1CPU + "cpu.cfs_period_us": s("-100000\n")},
			want:   Limits{CPUSetCores: 2, MemLimit: 256 * mib},
			errors: []string{"cpu.cfs_period_us", "negative"},
		},
		{
			name:   "v1 quota without period",
			base:   "v1-separate",
			files:  map[string]*string{v1CPU + "cpu.cfs_period_us": nil},
			want:   Limits{CPUSetCores: 2, MemLimit: 256 * mib},
			errors: []string{"cpu.cfs_period_us"},
		},
		{
			name: "v1 no quota: the period is not read",
			base: "v1-separate",
			files: map[string]*string{
				v1CPU + "cpu.cfs_quota_us":  s("-1\n"),
				v1CPU + "cpu.cfs_period_us": s("0\n"),
			},
			want: Limits{CPUSetCores: 2, MemLimit: 256 * mib},
		},
		{
			name:   "v1 negative memory limit",
			base:   "v1-separate",
			files:  map[string]*string{v1Memory + "memory.limit_in_bytes": s("-5\n")},
			want:   Limits{QuotaCores: 1.5, CPUSetCores: 2},
			errors: []string{"memory.limit_in_bytes", "negative"},
		},
		{
			name:   "v1 garbage memory limit",
			base:   "v1-separate",
			files:  map[string]*string{v1Memory + "memory.limit_in_bytes": s("lots\n")},
			want:   Limits{QuotaCores: 1.5, CPUSetCores: 2},
			errors: []string{"memory.limit_in_bytes", "invalid number"},
		},
		{
			name:  "v1 limit beyond int64 is unlimited",
			base:  "v1-separate",
			files: map[string]*string{v1Memory + "memory.limit_in_bytes": s("18446744073709551615\n")},
			want:  Limits{QuotaCores: 1.5, CPUSetCores: 2},
		},
		{
			name:   "v1 garbage cpuset",
			base:   "v1-separate",
			files:  map[string]*string{"sys/fs/cgroup/cpuset/cpuset.cpus": s("0-a\n")},
			want:   Limits{QuotaCores: 1.5, MemLimit: 256 * mib},
			errors: []string{"cpuset.cpus", "invalid number"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := copyTree(t, filepath.Join("testdata", tt.base))
			edit(t, root, tt.files)
			r, err := NewReader(root)
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })

			l, err := r.Limits()
			assert.Equal(t, tt.want, l)
			if len(tt.errors) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, e := range tt.errors {
				assert.Contains(t, err.Error(), e)
			}
		})
	}
}

// unreadable replaces each file with a directory of the same name: a file
// that cannot be read even by root, for whom chmod 000 changes nothing.
func unreadable(t *testing.T, root string, names ...string) {
	t.Helper()
	for _, name := range names {
		p := filepath.Join(root, filepath.FromSlash(name))
		require.NoError(t, os.Remove(p))
		require.NoError(t, os.Mkdir(p, 0o755))
	}
}

// TestLimitsLevelBadFromStart: in the v2-bad-level tree the pod level's
// cpu.max is garbage and its memory.max cannot be read from the first call
// on. The limits the other levels give (the parent's 3-core quota, the
// leaf's 2 GiB) are returned with an error naming both files: a limit looser
// than the unreadable one is still a limit, where none would leave the
// memory signal off.
func TestLimitsLevelBadFromStart(t *testing.T) {
	r, err := NewReader("testdata/v2-bad-level")
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	for range 2 { // the same again: nothing was known, nothing is lost
		l, err := r.Limits()
		assert.Equal(t, Limits{QuotaCores: 3, CPUSetCores: 4, MemLimit: 2 * gib}, l)
		checkErr(t, err, []string{"pod1/cpu.max", "invalid number", "pod1/memory.max", "is a directory"})
	}
}

// TestLimitsKeepsLastGoodLevel: a level whose files go bad after a good read
// counts with what it said then, so the limits do not loosen; once the files
// are good again their new values are read.
func TestLimitsKeepsLastGoodLevel(t *testing.T) {
	const (
		v2Pod = v2Dir + "kubepods/burstable/pod1/"
		v1Pod = "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/"
		v1Mem = "sys/fs/cgroup/memory/kubepods/pod1/"
		v1Set = "sys/fs/cgroup/cpuset/kubepods/pod1/"
	)
	tests := []struct {
		name       string
		base       string
		good       Limits
		garbage    map[string]*string
		unreadable []string
		errors     []string
		fixed      map[string]*string
		after      Limits
	}{
		{
			name:       "v2",
			base:       "v2-host",
			good:       Limits{QuotaCores: 4, CPUSetCores: 4, MemLimit: gib},
			garbage:    map[string]*string{v2Pod + "cpu.max": s("4OO000 100000\n"), v2Pod + "ctr/cpuset.cpus.effective": s("2-\n")},
			unreadable: []string{v2Pod + "memory.max"},
			errors:     []string{"pod1/cpu.max", "pod1/memory.max", "is a directory", "cpuset.cpus.effective"},
			fixed: map[string]*string{
				v2Pod + "cpu.max":                   s("300000 100000\n"),
				v2Pod + "memory.max":                s("536870912\n"),
				v2Pod + "ctr/cpuset.cpus.effective": s("2-3\n"),
			},
			after: Limits{QuotaCores: 3, CPUSetCores: 2, MemLimit: 512 * mib},
		},
		{
			name:       "v1",
			base:       "v1-combined",
			good:       Limits{QuotaCores: 2, CPUSetCores: 8, MemLimit: 512 * mib},
			garbage:    map[string]*string{v1Mem + "memory.limit_in_bytes": s("lots\n"), v1Set + "cpuset.cpus": s("0-x\n")},
			unreadable: []string{v1Pod + "cpu.cfs_period_us"},
			errors:     []string{"pod1/cpu.cfs_period_us", "pod1/memory.limit_in_bytes", "pod1/cpuset.cpus"},
			fixed: map[string]*string{
				v1Pod + "cpu.cfs_period_us":     s("100000\n"),
				v1Pod + "cpu.cfs_quota_us":      s("150000\n"),
				v1Mem + "memory.limit_in_bytes": s("268435456\n"),
				v1Set + "cpuset.cpus":           s("0-5\n"),
			},
			after: Limits{QuotaCores: 1.5, CPUSetCores: 6, MemLimit: 256 * mib},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := copyTree(t, filepath.Join("testdata", tt.base))
			r, err := NewReader(root)
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })
			l, err := r.Limits()
			require.NoError(t, err)
			require.Equal(t, tt.good, l)

			edit(t, root, tt.garbage)
			unreadable(t, root, tt.unreadable...)
			for range 2 { // and again: the last good value is kept, not used once
				l, err = r.Limits()
				assert.Equal(t, tt.good, l)
				checkErr(t, err, tt.errors)
			}

			for _, d := range tt.unreadable {
				require.NoError(t, os.RemoveAll(filepath.Join(root, filepath.FromSlash(d))))
			}
			edit(t, root, tt.fixed)
			l, err = r.Limits()
			require.NoError(t, err)
			assert.Equal(t, tt.after, l)
		})
	}
}

// TestLimitsTablesUnreadable: when /proc/self/cgroup cannot be read, the
// last limits come back with the error rather than none.
func TestLimitsTablesUnreadable(t *testing.T) {
	root := copyTree(t, "testdata/v2-host")
	r, err := NewReader(root)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	want := Limits{QuotaCores: 4, CPUSetCores: 4, MemLimit: gib}
	l, err := r.Limits()
	require.NoError(t, err)
	require.Equal(t, want, l)

	unreadable(t, root, "proc/self/cgroup")
	l, err = r.Limits()
	checkErr(t, err, []string{"proc/self/cgroup"})
	assert.Equal(t, want, l)
}

// TestUsageBadInput damages the per-tick files after NewReader (which checks
// the CPU time once), as a cgroup file going bad at run time would.
func TestUsageBadInput(t *testing.T) {
	tests := []struct {
		name   string
		base   string
		files  map[string]*string
		cpuErr []string
		wsErr  []string
		wsIs   error
	}{
		{
			name:   "v2 cpu.stat garbage",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.stat": s("usage_usec 12x\n")},
			cpuErr: []string{"cpu.stat", "invalid number", "usage_usec 12x"},
		},
		{
			name:   "v2 cpu.stat without usage_usec",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.stat": s("user_usec 5\nusage_usecs 6\n")},
			cpuErr: []string{"cpu.stat", "key not found"},
		},
		{
			name:   "v2 cpu.stat partial line",
			base:   "v2-container",
			files:  map[string]*string{v2Dir + "cpu.stat": s("usage_usec ")},
			cpuErr: []string{"cpu.stat", "empty value"},
		},
		{
			name:  "v2 memory.current garbage",
			base:  "v2-container",
			files: map[string]*string{v2Dir + "memory.current": s("-1\n")},
			wsErr: []string{"memory.current", "invalid number"},
		},
		{
			name:  "v2 memory.stat without inactive_file",
			base:  "v2-container",
			files: map[string]*string{v2Dir + "memory.stat": s("anon 5\nactive_file 3\n")},
			wsErr: []string{"memory.stat", "key not found"},
		},
		{
			name:   "v1 cpuacct.usage negative",
			base:   "v1-separate",
			files:  map[string]*string{v1Acct + "cpuacct.usage": s("-5\n")},
			cpuErr: []string{"cpuacct.usage", "invalid number"},
		},
		{
			name:   "v1 cpuacct.usage overflows a Duration",
			base:   "v1-separate",
			files:  map[string]*string{v1Acct + "cpuacct.usage": s("18446744073709551615\n")},
			cpuErr: []string{"cpuacct.usage", "out of range"},
		},
		{
			name:  "v1 memory.usage_in_bytes two numbers",
			base:  "v1-separate",
			files: map[string]*string{v1Memory + "memory.usage_in_bytes": s("12 34\n")},
			wsErr: []string{"memory.usage_in_bytes", "invalid number"},
		},
		{
			name:  "v1 memory.stat with inactive_file but not total_inactive_file",
			base:  "v1-separate",
			files: map[string]*string{v1Memory + "memory.stat": s("inactive_file 5\n")},
			wsErr: []string{"memory.stat", "key not found"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := copyTree(t, filepath.Join("testdata", tt.base))
			r, err := NewReader(root)
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })
			// The files stay open between reads: rewriting them in place
			// must be seen by the next read.
			edit(t, root, tt.files)

			_, err = r.CPUTime()
			checkErr(t, err, tt.cpuErr)
			_, err = r.WorkingSet()
			checkErr(t, err, tt.wsErr)
		})
	}
}

func checkErr(t *testing.T, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		require.NoError(t, err)
		return
	}
	require.Error(t, err)
	for _, w := range want {
		assert.Contains(t, err.Error(), w)
	}
}

func TestNewReaderBadInput(t *testing.T) {
	tests := []struct {
		name    string
		base    string
		files   map[string]*string
		message []string
	}{
		{
			name:    "v2 cpu.stat missing",
			base:    "v2-container",
			files:   map[string]*string{v2Dir + "cpu.stat": nil},
			message: []string{"v2:", "cpu.stat"},
		},
		{
			name:    "v1 cpuacct.usage missing",
			base:    "v1-separate",
			files:   map[string]*string{v1Acct + "cpuacct.usage": nil},
			message: []string{"v1:", "cpuacct.usage"},
		},
		{
			name:    "v1 cpuacct.usage garbage",
			base:    "v1-separate",
			files:   map[string]*string{v1Acct + "cpuacct.usage": s("nope")},
			message: []string{"cpuacct.usage", "invalid number"},
		},
		{
			name:    "mountinfo partial line",
			base:    "v2-container",
			files:   map[string]*string{"proc/self/mountinfo": s("29 23 0:26 / /sys/fs/cgroup rw - cgroup2\n")},
			message: []string{"mountinfo", "line 1: malformed"},
		},
		{
			name:    "proc cgroup garbage",
			base:    "v2-container",
			files:   map[string]*string{"proc/self/cgroup": s("garbage\n")},
			message: []string{"proc/self/cgroup", "line 1"},
		},
		{
			name:    "proc cgroup missing",
			base:    "v2-container",
			files:   map[string]*string{"proc/self/cgroup": nil},
			message: []string{"proc/self/cgroup"},
		},
		{
			name:    "no line for the v2 hierarchy",
			base:    "v2-container",
			files:   map[string]*string{"proc/self/cgroup": s("1:name=systemd:/\n")},
			message: []string{"no cpuacct controller"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := copyTree(t, filepath.Join("testdata", tt.base))
			edit(t, root, tt.files)
			r, err := NewReader(root)
			require.ErrorIs(t, err, ErrNoCgroup)
			assert.Nil(t, r)
			for _, m := range tt.message {
				assert.Contains(t, err.Error(), m)
			}
		})
	}
}

// TestNewReaderOddProcCgroupLine: one line of /proc/self/cgroup that
// cannot be parsed leaves the others in use: the reader finds the same
// directories and reads the same values as with the clean file.
func TestNewReaderOddProcCgroupLine(t *testing.T) {
	f := func(base, procCgroup string) {
		t.Helper()
		clean, err := NewReader(filepath.Join("testdata", base))
		require.NoError(t, err)
		defer clean.Close()
		root := copyTree(t, filepath.Join("testdata", base))
		edit(t, root, map[string]*string{"proc/self/cgroup": &procCgroup})
		r, err := NewReader(root)
		require.NoError(t, err, procCgroup)
		defer r.Close()
		assert.Equal(t, clean.Describe(), r.Describe(), procCgroup)
		cpu, err := r.CPUTime()
		require.NoError(t, err)
		wantCPU, _ := clean.CPUTime()
		assert.Equal(t, wantCPU, cpu)
		limits, err := r.Limits()
		require.NoError(t, err)
		wantLimits, _ := clean.Limits()
		assert.Equal(t, wantLimits, limits)
	}
	f("v1-separate", "9:name=systemd:/\n8:pids:/a\nb\n5:devices:/\n4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n")
	f("v1-separate", "garbage\n4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n")
	f("v2-container", "1:name=systemd:relative\n0::/\n")
	f("v2-host", "0::/kubepods/burstable/pod1/ctr\n12:misc\n")
}

// TestFindDirs: the directories NewReader reads, without reading them.
func TestFindDirs(t *testing.T) {
	f := func(base string, want Dirs) {
		t.Helper()
		root := filepath.Join("testdata", base)
		for _, d := range []*string{&want.CPU, &want.CPUAcct, &want.Memory} {
			if *d != "" {
				*d = filepath.Join(root, *d)
			}
		}
		got, err := FindDirs(root)
		require.NoError(t, err, base)
		assert.Equal(t, want, got, base)
	}
	f("v1-separate", Dirs{Version: 1, CPU: v1CPU, CPUAcct: v1Acct, Memory: v1Memory})
	f("v1-combined", Dirs{Version: 1, CPU: "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr", CPUAcct: "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/ctr", Memory: "sys/fs/cgroup/memory/kubepods/pod1/ctr"})
	f("v1-no-memory", Dirs{Version: 1, CPU: "sys/fs/cgroup/cpu,cpuacct", CPUAcct: "sys/fs/cgroup/cpu,cpuacct"})
	f("hybrid", Dirs{Version: 1, CPU: "sys/fs/cgroup/cpu,cpuacct/system.slice/otelcol.service", CPUAcct: "sys/fs/cgroup/cpu,cpuacct/system.slice/otelcol.service", Memory: "sys/fs/cgroup/memory/system.slice/otelcol.service"})
	f("v2-host", Dirs{Version: 2, CPU: "sys/fs/cgroup/kubepods/burstable/pod1/ctr", CPUAcct: "sys/fs/cgroup/kubepods/burstable/pod1/ctr", Memory: "sys/fs/cgroup/kubepods/burstable/pod1/ctr"})
	f("v2-bind-leaf", Dirs{Version: 2, CPU: v2Dir, CPUAcct: v2Dir, Memory: v2Dir}) // the mount point: own directory not visible

	_, err := FindDirs(filepath.Join("testdata", "none"))
	require.ErrorIs(t, err, ErrNoCgroup)
}

func TestWorkingSetNoMemoryV2(t *testing.T) {
	// The memory controller is not enabled for the process's cgroup.
	root := copyTree(t, "testdata/v2-container")
	edit(t, root, map[string]*string{v2Dir + "memory.current": nil})
	r, err := NewReader(root)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	_, err = r.WorkingSet()
	require.ErrorIs(t, err, ErrNoMemory)
	assert.Contains(t, err.Error(), "memory.current")
}

// TestLimitsFollowsMove: a process moved to another cgroup is followed at
// the next Limits call, and the per-tick files are re-pointed.
func TestLimitsFollowsMove(t *testing.T) {
	root := copyTree(t, "testdata/v2-host")
	r, err := NewReader(root)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })

	pod2 := v2Dir + "kubepods/burstable/pod2/"
	edit(t, root, map[string]*string{
		"proc/self/cgroup":        s("0::/kubepods/burstable/pod2/ctr2\n"),
		pod2 + "cpu.max":          s("50000 100000\n"),
		pod2 + "ctr2/cpu.stat":    s("usage_usec 77\n"),
		pod2 + "ctr2/cpu.max":     s("max 100000\n"),
		pod2 + "ctr2/memory.max":  s("max\n"),
		pod2 + "ctr2/memory.stat": s("inactive_file 0\n"),
	})
	// Until Limits, the old cgroup is read.
	cpu, err := r.CPUTime()
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, cpu)

	l, err := r.Limits()
	require.NoError(t, err)
	assert.Equal(t, Limits{QuotaCores: 0.5, CPUSetCores: 16, MemLimit: 8 * gib}, l)
	assert.Equal(t, "cgroup v2 /sys/fs/cgroup/kubepods/burstable/pod2/ctr2", r.Describe())
	cpu, err = r.CPUTime()
	require.NoError(t, err)
	assert.Equal(t, 77*time.Microsecond, cpu)
}

// TestReadsDoNotAllocate checks the contract with the sampler: no
// allocation per tick apart from what reading files needs, and the files
// here need none.
func TestReadsDoNotAllocate(t *testing.T) {
	for _, name := range []string{"v2-host", "v1-separate"} {
		t.Run(name, func(t *testing.T) {
			r, err := NewReader(filepath.Join("testdata", name))
			require.NoError(t, err)
			t.Cleanup(func() { _ = r.Close() })
			_, err = r.WorkingSet() // opens the memory files once
			require.NoError(t, err)
			allocs := testing.AllocsPerRun(100, func() {
				_, _ = r.CPUTime()
				_, _ = r.WorkingSet()
			})
			assert.Zero(t, allocs)
		})
	}
}

func TestCloseThenReadReopens(t *testing.T) {
	r, err := NewReader("testdata/v2-container")
	require.NoError(t, err)
	require.NoError(t, r.Close())
	// Close releases the descriptors; a later read reopens rather than
	// failing, so an extension restarted with the same Reader still works.
	cpu, err := r.CPUTime()
	require.NoError(t, err)
	assert.Equal(t, 123456789*time.Microsecond, cpu)
	require.NoError(t, r.Close())
}

func BenchmarkReaderCPUTime(b *testing.B) {
	for _, name := range []string{"v2-host", "v1-separate"} {
		b.Run(name, func(b *testing.B) {
			r, err := NewReader(filepath.Join("testdata", name))
			require.NoError(b, err)
			b.Cleanup(func() { _ = r.Close() })
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.CPUTime(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkReaderWorkingSet(b *testing.B) {
	for _, name := range []string{"v2-host", "v1-separate"} {
		b.Run(name, func(b *testing.B) {
			r, err := NewReader(filepath.Join("testdata", name))
			require.NoError(b, err)
			b.Cleanup(func() { _ = r.Close() })
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.WorkingSet(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkReaderLimits(b *testing.B) {
	r, err := NewReader("testdata/v2-host")
	require.NoError(b, err)
	b.Cleanup(func() { _ = r.Close() })
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Limits(); err != nil {
			b.Fatal(err)
		}
	}
}
