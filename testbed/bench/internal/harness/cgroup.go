// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/otelthrottle/throttle/internal/cgroup"
)

// Cgroup is the limited cgroup the collector runs in, created by the
// harness: v2 one directory, v1 one per controller (cpu, cpuacct, memory),
// each a child of this process's own cgroup of that controller (on this
// kind of machine memory sits under a sandbox's path and only a child of it
// may be created).
type Cgroup struct {
	// Name is its directories' name under each controller.
	Name    string
	Version int
	// dirs created, in creation order (removed in reverse).
	Dirs                       []string
	cpuDir, cpuacctDir, memDir string
}

// Resolve finds where a child cgroup would go for each controller: in this
// process's own cgroup, found as the throttle finds it (internal/cgroup),
// which must have the cpu, cpuacct and memory controllers (v1) or offer cpu
// and memory to its children (v2).
func Resolve(root string) (version int, cpu, cpuacct, memory string, err error) {
	d, err := cgroup.FindDirs(root)
	if err != nil {
		return 0, "", "", "", err
	}
	switch d.Version {
	case 1:
		if d.CPU != "" && d.CPUAcct != "" && d.Memory != "" {
			return 1, d.CPU, d.CPUAcct, d.Memory, nil
		}
	case 2:
		if d.CPU == "" {
			break
		}
		// The own directory of a process in a leaf it cannot read has none.
		b, err := os.ReadFile(filepath.Join(d.CPU, "cgroup.controllers"))
		if ctrl := strings.Fields(string(b)); err == nil && slices.Contains(ctrl, "cpu") && slices.Contains(ctrl, "memory") {
			return 2, d.CPU, d.CPU, d.CPU, nil
		}
	}
	return 0, "", "", "", errors.New("no cgroup v1 cpu+cpuacct+memory nor cgroup v2 with cpu and memory controllers")
}

// CreateCgroup creates the cgroup name limited to cpus cores and memBytes.
// Its errors name the cgroup.
func CreateCgroup(name string, cpus float64, memBytes uint64) (*Cgroup, error) {
	cg, err := createCgroup(name, cpus, memBytes)
	if err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", name, err)
	}
	return cg, nil
}

func createCgroup(name string, cpus float64, memBytes uint64) (*Cgroup, error) {
	version, cpu, cpuacct, mem, err := Resolve("/")
	if err != nil {
		return nil, err
	}
	cg := &Cgroup{Name: name, Version: version}
	mk := func(parent string) (string, error) {
		d := filepath.Join(parent, name)
		for _, existing := range cg.Dirs {
			if existing == d { // cpu and cpuacct mounted together
				return d, nil
			}
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
		cg.Dirs = append(cg.Dirs, d)
		return d, nil
	}
	fail := func(err error) (*Cgroup, error) {
		return nil, errors.Join(err, cg.Destroy())
	}
	const period = 100000
	quota := int64(cpus * period)
	if version == 2 {
		// Enable the controllers for children of the parent, if needed.
		_ = os.WriteFile(filepath.Join(cpu, "cgroup.subtree_control"), []byte("+cpu +memory"), 0)
		d, err := mk(cpu)
		if err != nil {
			return fail(err)
		}
		cg.cpuDir, cg.cpuacctDir, cg.memDir = d, d, d
		if err := write(d, "cpu.max", fmt.Sprintf("%d %d", quota, period)); err != nil {
			return fail(err)
		}
		if err := write(d, "memory.max", strconv.FormatUint(memBytes, 10)); err != nil {
			return fail(err)
		}
		_ = write(d, "memory.swap.max", "0")
		// A high weight so that a busy machine does not starve the collector
		// below its quota (the quota still caps it), as a Guaranteed pod.
		_ = write(d, "cpu.weight", "10000")
		return cg, nil
	}
	if cg.cpuDir, err = mk(cpu); err != nil {
		return fail(err)
	}
	if cg.cpuacctDir, err = mk(cpuacct); err != nil {
		return fail(err)
	}
	if cg.memDir, err = mk(mem); err != nil {
		return fail(err)
	}
	if err := write(cg.cpuDir, "cpu.cfs_period_us", strconv.Itoa(period)); err != nil {
		return fail(err)
	}
	if err := write(cg.cpuDir, "cpu.cfs_quota_us", strconv.FormatInt(quota, 10)); err != nil {
		return fail(err)
	}
	// High shares so that a busy machine does not starve the collector
	// below its quota (the quota still caps it), as a Guaranteed pod.
	_ = write(cg.cpuDir, "cpu.shares", "10240")
	if err := write(cg.memDir, "memory.limit_in_bytes", strconv.FormatUint(memBytes, 10)); err != nil {
		return fail(err)
	}
	// No swap: the limit is the limit (fails harmlessly without swap accounting).
	_ = write(cg.memDir, "memory.memsw.limit_in_bytes", strconv.FormatUint(memBytes, 10))
	_ = write(cg.memDir, "memory.swappiness", "0")
	return cg, nil
}

func write(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", value, filepath.Join(dir, file), err)
	}
	return nil
}

// ProcsFiles are the cgroup.procs a process must be written to.
func (c *Cgroup) ProcsFiles() []string {
	var out []string
	for _, d := range c.Dirs {
		out = append(out, filepath.Join(d, "cgroup.procs"))
	}
	return out
}

// MemoryDir is the directory of the memory controller (v2: the cgroup's).
func (c *Cgroup) MemoryDir() string { return c.memDir }

// ProcsFilesOf are the cgroup.procs of the named controllers only ("cpu",
// "cpuacct", "memory"): a helper process placed in the memory controller
// alone counts against the memory limit and not the CPU quota. Under
// cgroup v2 one directory holds every controller, so it is all of them.
func (c *Cgroup) ProcsFilesOf(controllers ...string) ([]string, error) {
	var out []string
	for _, ctl := range controllers {
		var d string
		switch ctl {
		case "cpu":
			d = c.cpuDir
		case "cpuacct":
			d = c.cpuacctDir
		case "memory":
			d = c.memDir
		default:
			return nil, fmt.Errorf("unknown cgroup controller %q (want cpu, cpuacct or memory)", ctl)
		}
		f := filepath.Join(d, "cgroup.procs")
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out, nil
}

// Pids lists the processes in the cgroup.
func (c *Cgroup) Pids() []int {
	seen := map[int]bool{}
	var out []int
	for _, f := range c.ProcsFiles() {
		data, _ := os.ReadFile(f)
		for _, l := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(l); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// Remove kills whatever is left in the cgroup (only what the harness
// started runs there, so a leftover is its own) and removes the cgroup,
// reporting both through logf.
func (c *Cgroup) Remove(logf func(format string, args ...any)) {
	for _, pid := range c.Pids() {
		logf("killing leftover pid %d in %s", pid, c.Name)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if err := c.Destroy(); err != nil {
		logf("removing cgroup %s: %v", c.Name, err)
	}
}

// Destroy removes the directories; they must be empty of processes (the
// caller kills what it started first). Retries briefly: the kernel frees a
// memory cgroup a moment after its last process exits.
func (c *Cgroup) Destroy() error {
	var errs []error
	for i := len(c.Dirs) - 1; i >= 0; i-- {
		var err error
		for range 50 {
			if err = os.Remove(c.Dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	c.Dirs = nil
	return errors.Join(errs...)
}

// CgStats is one reading of the cgroup.
type CgStats struct {
	Usage, InactiveFile, WorkingSet, Limit uint64
	CPUUsage                               time.Duration // cumulative
	OOMKills                               uint64
	NrThrottled                            uint64
	ThrottledTime                          time.Duration
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// readKV reads a flat "key value" file (memory.stat, cpu.stat, ...).
func readKV(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, sc.Err()
}

func (c *Cgroup) Stats() (CgStats, error) {
	var s CgStats
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.Version == 2 {
		var err error
		s.Usage, err = readUint(filepath.Join(c.memDir, "memory.current"))
		add(err)
		s.Limit, err = readUint(filepath.Join(c.memDir, "memory.max"))
		add(err)
		ms, err := readKV(filepath.Join(c.memDir, "memory.stat"))
		add(err)
		s.InactiveFile = ms["inactive_file"]
		ev, err := readKV(filepath.Join(c.memDir, "memory.events"))
		add(err)
		s.OOMKills = ev["oom_kill"]
		cs, err := readKV(filepath.Join(c.cpuDir, "cpu.stat"))
		add(err)
		s.CPUUsage = usec(cs["usage_usec"])
		s.NrThrottled = cs["nr_throttled"]
		s.ThrottledTime = usec(cs["throttled_usec"])
	} else {
		var err error
		s.Usage, err = readUint(filepath.Join(c.memDir, "memory.usage_in_bytes"))
		add(err)
		s.Limit, err = readUint(filepath.Join(c.memDir, "memory.limit_in_bytes"))
		add(err)
		ms, err := readKV(filepath.Join(c.memDir, "memory.stat"))
		add(err)
		s.InactiveFile = ms["total_inactive_file"]
		oc, err := readKV(filepath.Join(c.memDir, "memory.oom_control"))
		add(err)
		s.OOMKills = oc["oom_kill"]
		ns, err := readUint(filepath.Join(c.cpuacctDir, "cpuacct.usage"))
		add(err)
		s.CPUUsage = nsec(ns)
		cs, err := readKV(filepath.Join(c.cpuDir, "cpu.stat"))
		add(err)
		s.NrThrottled = cs["nr_throttled"]
		s.ThrottledTime = nsec(cs["throttled_time"])
	}
	if s.Usage > s.InactiveFile {
		s.WorkingSet = s.Usage - s.InactiveFile
	}
	return s, errors.Join(errs...)
}

// usec and nsec convert kernel counters of microseconds and nanoseconds to
// a Duration, saturating rather than wrapping (the counters stay far below).
func usec(n uint64) time.Duration {
	if n > math.MaxInt64/uint64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Microsecond
}

func nsec(n uint64) time.Duration {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(n)
}
