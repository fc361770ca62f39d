// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"time"
)

// ErrNoCgroup is wrapped by every error NewReader returns: no cgroup CPU
// accounting (v1 cpuacct or v2 cpu.stat) could be found and read. The caller
// then falls back to NewProcess.
var ErrNoCgroup = errors.New("cgroup: no usable cgroup")

// ErrNoMemory is returned (possibly wrapped) by Reader.WorkingSet when the
// process has no memory controller: v1 without a memory mount, or v2 with the
// memory controller not enabled for the process's cgroup (no memory.current);
// and by Process.WorkingSet where there is no /proc/self/statm.
// Limits then reports MemLimit 0. The memory signal is invalid in that case
// unless the user configures a limit, and even then there is no usage to
// compare it with, so the caller should treat it as "no memory signal".
var ErrNoMemory = errors.New("cgroup: no memory controller")

var errNoCPUAcct = errors.New("cgroup: no cpuacct controller")

// ctrlDir is where one controller's files for the process are.
type ctrlDir struct {
	// mount is the controller's mount point (without the Reader's root
	// prefix); "" when the controller was not found.
	mount string
	// rel is the process's cgroup path relative to the mount's root field,
	// "/" meaning the mount point itself.
	rel string
	// own is false when the process's own directory is not visible (a
	// bind-mounted leaf, or a path outside the mount's root): rel is then
	// "/" and the mount point is used as the only choice left.
	own bool
}

func (c ctrlDir) dir() string { return path.Join(c.mount, c.rel) }

// Reader reads the process's cgroup (v1 or v2) under a root folder.
//
// A Reader is not safe for concurrent use: the sampler calls it from its one
// goroutine. It keeps the files read every tick open and reuses one buffer,
// so CPUTime and WorkingSet do not allocate; Close releases the descriptors
// (a Reader that is dropped without Close has them closed by the garbage
// collector, as for any *os.File).
type Reader struct {
	root    string
	version int

	cpu, cpuacct, cpuset, memory ctrlDir

	usage    hotFile // v1 cpuacct.usage, v2 cpu.stat
	memUsage hotFile // v1 memory.usage_in_bytes, v2 memory.current
	memStat  hotFile // memory.stat

	describe string
	buf      []byte

	// Limits state: the last value read from each limit file, by host path,
	// and the last limits returned.
	quotas  memo[float64]
	mems    memo[uint64]
	cpusets memo[int]
	last    Limits
}

// memo keeps the last good value of each limit file the previous Limits call
// walked, so that a file failing now counts with what it said before rather
// than with no limit: one level going bad must not loosen the limits.
type memo[T any] struct{ prev, cur map[string]T }

// next starts a walk: what the last walk read becomes the fallback. The two
// maps are swapped and reused.
func (m *memo[T]) next() {
	m.prev, m.cur = m.cur, m.prev
	if m.cur == nil {
		m.cur = make(map[string]T)
	}
	clear(m.cur)
}

// ok records v, read from p on this walk.
func (m *memo[T]) ok(p string, v T) { m.cur[p] = v }

// failed returns the value p gave on the last walk, if any, and keeps it for
// the next one.
func (m *memo[T]) failed(p string) (T, bool) {
	v, ok := m.prev[p]
	if ok {
		m.cur[p] = v
	}
	return v, ok
}

// NewReader finds the process's cgroup from <root>/proc/self/mountinfo and
// <root>/proc/self/cgroup and reads its files under <root>. root is "/" in
// production; tests point it at fixture trees.
//
// When both are mounted (hybrid: an empty v2 hierarchy next to v1), the v1
// controllers are used whenever v1 holds cpu or cpuacct: a v2 hierarchy
// cannot hold the cpu controller while v1 does, so its directories carry no
// quota, and its cpu.stat is often the machine's root. There is no fallback
// from a broken v1 to v2 for the same reason. v2 is used when v1 has no CPU
// controller. NewReader reads the CPU time once to check that the chosen
// version works; every error it returns wraps ErrNoCgroup.
func NewReader(root string) (*Reader, error) {
	r, err := locate(root)
	if err != nil {
		return nil, err
	}
	if _, err := r.CPUTime(); err != nil {
		r.Close()
		return nil, fmt.Errorf("%w: v%d: %w", ErrNoCgroup, r.version, err)
	}
	return r, nil
}

// locate is NewReader up to the choice of version and directories: it
// reads no cgroup file.
func locate(root string) (*Reader, error) {
	if root == "" {
		root = "/"
	}
	r := &Reader{root: root}
	mounts, lines, err := r.readTables()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	hasV1, hasV2 := false, false
	for _, m := range mounts {
		hasV1 = hasV1 || (!m.v2 && (m.has("cpu") || m.has("cpuacct")))
		hasV2 = hasV2 || m.v2
	}
	switch {
	case hasV1:
		r.version = 1
	case hasV2:
		r.version = 2
	default:
		return nil, fmt.Errorf("%w: no cgroup mount with a cpu or cpuacct controller and no cgroup2 mount in %s",
			ErrNoCgroup, r.hostPath("/proc/self", "mountinfo"))
	}
	r.apply(mounts, lines)
	return r, nil
}

// Dirs are the directories of the process's own cgroup under the root they
// were found from.
type Dirs struct {
	// Version is 1 or 2.
	Version int
	// CPU, CPUAcct and Memory are the controllers' directories: one and the
	// same with v2; with v1 "" for a controller that is not mounted.
	CPU, CPUAcct, Memory string
}

// FindDirs finds the directories of the process's own cgroup under root as
// NewReader does (the same choice of version, the mount point where the
// process's own directory is not visible), without reading any cgroup
// file. Its errors wrap ErrNoCgroup.
func FindDirs(root string) (Dirs, error) {
	r, err := locate(root)
	if err != nil {
		return Dirs{}, err
	}
	dir := func(c ctrlDir) string {
		if c.mount == "" {
			return ""
		}
		return r.hostPath(c.dir(), "")
	}
	return Dirs{Version: r.version, CPU: dir(r.cpu), CPUAcct: dir(r.cpuacct), Memory: dir(r.memory)}, nil
}

func (r *Reader) hostPath(dir, file string) string {
	return filepath.Join(r.root, filepath.FromSlash(dir), file)
}

// readTables reads and parses mountinfo and /proc/self/cgroup.
func (r *Reader) readTables() ([]mount, []procCgroup, error) {
	mi := r.hostPath("/proc/self", "mountinfo")
	data, err := os.ReadFile(mi)
	if err != nil {
		return nil, nil, err
	}
	mounts, err := parseMountinfo(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", mi, err)
	}
	pc := r.hostPath("/proc/self", "cgroup")
	data, err = os.ReadFile(pc)
	if err != nil {
		return nil, nil, err
	}
	lines, err := parseProcCgroup(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", pc, err)
	}
	return mounts, lines, nil
}

// locate resolves the directory of the process's cgroup path cgPath under
// mount m: the mount point joined with the path made relative to the mount's
// root field. Only when that directory does not exist is the mount point
// used; while it exists the mount point is never read for usage, since on a
// host it describes the whole machine.
func (r *Reader) locate(m mount, cgPath string) ctrlDir {
	c := ctrlDir{mount: m.point, rel: "/"}
	rel, ok := relPath(m.root, cgPath)
	if !ok {
		return c
	}
	if rel != "/" {
		if st, err := os.Stat(r.hostPath(path.Join(m.point, rel), "")); err != nil || !st.IsDir() {
			return c
		}
	}
	c.rel, c.own = rel, true
	return c
}

// apply resolves every controller's directory for r.version and points the
// per-tick files at it.
func (r *Reader) apply(mounts []mount, lines []procCgroup) {
	r.cpu, r.cpuacct, r.cpuset, r.memory = ctrlDir{}, ctrlDir{}, ctrlDir{}, ctrlDir{}
	if r.version == 2 {
		if p, ok := v2Path(lines); ok {
			if m, ok := findV2Mount(mounts, p); ok {
				d := r.locate(m, p)
				r.cpu, r.cpuacct, r.cpuset, r.memory = d, d, d, d
			}
		}
	} else {
		for _, c := range []struct {
			name string
			dst  *ctrlDir
		}{{"cpu", &r.cpu}, {"cpuacct", &r.cpuacct}, {"cpuset", &r.cpuset}, {"memory", &r.memory}} {
			p, ok := v1Path(lines, c.name)
			if !ok {
				continue
			}
			if m, ok := findV1Mount(mounts, c.name, p); ok {
				*c.dst = r.locate(m, p)
			}
		}
	}

	usage, memUsage := "cpuacct.usage", "memory.usage_in_bytes"
	if r.version == 2 {
		usage, memUsage = "cpu.stat", "memory.current"
	}
	r.usage.setPath(r.filePath(r.cpuacct, usage))
	r.memUsage.setPath(r.filePath(r.memory, memUsage))
	r.memStat.setPath(r.filePath(r.memory, "memory.stat"))
	r.describe = r.buildDescribe()
}

// filePath is the host path of file in c's directory, "" when c is missing.
func (r *Reader) filePath(c ctrlDir, file string) string {
	if c.mount == "" {
		return ""
	}
	return r.hostPath(c.dir(), file)
}

func (r *Reader) buildDescribe() string {
	show := func(c ctrlDir) string {
		switch {
		case c.mount == "":
			return "none"
		case !c.own:
			return c.dir() + " (mount point: own cgroup not visible)"
		}
		return c.dir()
	}
	if r.version == 2 {
		return "cgroup v2 " + show(r.cpu)
	}
	return fmt.Sprintf("cgroup v1 cpu=%s cpuacct=%s cpuset=%s memory=%s",
		show(r.cpu), show(r.cpuacct), show(r.cpuset), show(r.memory))
}

// Version returns the cgroup version in use, 1 or 2.
func (r *Reader) Version() int { return r.version }

// Describe names the cgroup directories read, without the root prefix, e.g.
// "cgroup v2 /sys/fs/cgroup/kubepods/pod1/ctr".
func (r *Reader) Describe() string { return r.describe }

// Close closes the files kept open between reads. It is not required (the
// garbage collector closes dropped files) but releases them at once; a read
// after Close reopens them.
func (r *Reader) Close() error {
	r.usage.close()
	r.memUsage.close()
	r.memStat.close()
	return nil
}

func parseError(file string, data []byte, err error) error {
	const maxShown = 64
	if len(data) > maxShown {
		data = data[:maxShown]
	}
	return fmt.Errorf("cgroup: parse %s: %w (content %q)", file, err, data)
}

// CPUTime returns the cumulative CPU time of the process's cgroup
// (v2 cpu.stat usage_usec, v1 cpuacct.usage).
func (r *Reader) CPUTime() (time.Duration, error) {
	if r.usage.path == "" {
		return 0, errNoCPUAcct
	}
	b, err := r.usage.read(&r.buf)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	if r.version == 2 {
		us, err := parseKeyValue(b, "usage_usec")
		if err != nil {
			return 0, parseError(r.usage.path, b, err)
		}
		if us > math.MaxInt64/uint64(time.Microsecond) {
			return 0, parseError(r.usage.path, b, errRange)
		}
		return time.Duration(us) * time.Microsecond, nil
	}
	ns, err := parseUint(b)
	if err != nil {
		return 0, parseError(r.usage.path, b, err)
	}
	if ns > math.MaxInt64 {
		return 0, parseError(r.usage.path, b, errRange)
	}
	return time.Duration(ns), nil
}

// WorkingSet returns max(0, usage - inactive_file) of the process's memory
// cgroup (v1 memory.usage_in_bytes minus total_inactive_file, v2
// memory.current minus inactive_file). Without a memory controller it
// returns an error wrapping ErrNoMemory.
func (r *Reader) WorkingSet() (uint64, error) {
	if r.memUsage.path == "" {
		return 0, ErrNoMemory
	}
	b, err := r.memUsage.read(&r.buf)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("%w: %w", ErrNoMemory, err)
		}
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	usage, err := parseUint(b)
	if err != nil {
		return 0, parseError(r.memUsage.path, b, err)
	}
	b, err = r.memStat.read(&r.buf)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	key := "total_inactive_file" // v1: hierarchical, includes children
	if r.version == 2 {
		key = "inactive_file" // v2 memory.stat is always hierarchical
	}
	inactive, err := parseKeyValue(b, key)
	if err != nil {
		return 0, parseError(r.memStat.path, b, err)
	}
	if inactive >= usage {
		return 0, nil
	}
	return usage - inactive, nil
}

// Limits re-resolves the process's cgroup directories (a process moved to
// another cgroup is followed; the sampler calls Limits at its slow cadence)
// and returns the binding limits: the smallest CPU quota and memory limit on
// the path from the process's cgroup up to the mount point (a leaf often says
// "max" while the pod level holds the quota), and the CPU count of the
// nearest cpuset.
//
// A level without the file is skipped (the controller is not enabled there,
// or it is the v2 root, which has no cpu.max). A file that cannot be read or
// parsed (garbage, a quota or period of 0, a negative number other than the
// v1 -1 "no quota") counts with the value it gave at the previous call, or is
// skipped when it gave none, and Limits returns an error naming every such
// file along with the limits. Those limits are the best known: they keep
// what every other level says, and are looser than the real ones only where
// a level never could be read, which is still tighter than no limit at all,
// so the caller should use them and report the error. When mountinfo or
// /proc/self/cgroup cannot be read, the previous limits are returned with
// the error.
func (r *Reader) Limits() (Limits, error) {
	mounts, lines, err := r.readTables()
	if err != nil {
		return r.last, fmt.Errorf("cgroup: %w", err)
	}
	r.apply(mounts, lines)
	r.quotas.next()
	r.mems.next()
	r.cpusets.next()

	var l Limits
	var errs []error
	fail := func(err error) { errs = append(errs, err) }
	l.QuotaCores = r.minQuota(fail)
	if r.version == 2 {
		l.MemLimit = r.minMem("memory.max", parseMemoryMax, fail)
		l.CPUSetCores = r.nearestCPUSet("cpuset.cpus.effective", fail)
	} else {
		l.MemLimit = r.minMem("memory.limit_in_bytes", parseV1MemoryLimit, fail)
		l.CPUSetCores = r.nearestCPUSet("cpuset.cpus", fail)
	}
	r.last = l
	return l, errors.Join(errs...)
}

// walk calls fn for the directory of c and each of its parents up to the
// mount point, stopping when fn returns false.
func walk(c ctrlDir, fn func(dir string) bool) {
	if c.mount == "" {
		return
	}
	rel := c.rel
	for {
		if !fn(path.Join(c.mount, rel)) || rel == "/" {
			return
		}
		rel = path.Dir(rel)
	}
}

// minQuota returns the smallest CPU quota in cores on the walk up from the
// process's cpu cgroup, 0 when there is none.
func (r *Reader) minQuota(fail func(error)) float64 {
	var best float64
	walk(r.cpu, func(dir string) bool {
		var v float64
		var err error
		if r.version == 2 {
			v, err = r.v2Cores(dir)
		} else {
			v, err = r.v1Cores(dir)
		}
		if err != nil {
			fail(err)
			v, _ = r.quotas.failed(dir)
		} else {
			r.quotas.ok(dir, v)
		}
		if v > 0 && (best == 0 || v < best) {
			best = v
		}
		return true
	})
	return best
}

// v2Cores reads cpu.max in dir; 0 means no quota at this level.
func (r *Reader) v2Cores(dir string) (float64, error) {
	p := r.hostPath(dir, "cpu.max")
	b, err := readFile(p, &r.buf)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	v, err := parseCPUMax(b)
	if err != nil {
		return 0, parseError(p, b, err)
	}
	return v, nil
}

// v1Cores reads cpu.cfs_quota_us and cpu.cfs_period_us in dir; 0 means no
// quota at this level (the quota file is missing or -1).
func (r *Reader) v1Cores(dir string) (float64, error) {
	qp := r.hostPath(dir, "cpu.cfs_quota_us")
	b, err := readFile(qp, &r.buf)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	quota, none, err := parseV1Quota(b)
	if err != nil {
		return 0, parseError(qp, b, err)
	}
	if none {
		return 0, nil
	}
	pp := r.hostPath(dir, "cpu.cfs_period_us")
	if b, err = readFile(pp, &r.buf); err != nil {
		// A quota without a period cannot be turned into cores.
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	period, err := parseV1Period(b)
	if err != nil {
		return 0, parseError(pp, b, err)
	}
	return float64(quota) / float64(period), nil
}

// minMem returns the smallest memory limit (file parsed by parse, 0 = none)
// on the walk up from the process's memory cgroup, 0 when there is none.
func (r *Reader) minMem(file string, parse func([]byte) (uint64, error), fail func(error)) uint64 {
	var best uint64
	walk(r.memory, func(dir string) bool {
		p := r.hostPath(dir, file)
		b, err := readFile(p, &r.buf)
		var v uint64
		switch {
		case errors.Is(err, fs.ErrNotExist):
			r.mems.ok(p, 0)
			return true
		case err != nil:
			fail(fmt.Errorf("cgroup: %w", err))
			v, _ = r.mems.failed(p)
		default:
			if v, err = parse(b); err != nil {
				fail(parseError(p, b, err))
				v, _ = r.mems.failed(p)
			} else {
				r.mems.ok(p, v)
			}
		}
		if v > 0 && (best == 0 || v < best) {
			best = v
		}
		return true
	})
	return best
}

// nearestCPUSet counts the CPUs of the nearest level whose cpuset file is not
// empty. The nearest one binds: a child's cpuset is always a subset of its
// parent's (v2 cpuset.cpus.effective already says so), and a v1 child's
// cpuset.cpus is empty until set. A level that fails counts with its
// previous count; without one the walk goes on up, since a parent's count is
// still a true, if looser, bound.
func (r *Reader) nearestCPUSet(file string, fail func(error)) int {
	n := 0
	walk(r.cpuset, func(dir string) bool {
		p := r.hostPath(dir, file)
		b, err := readFile(p, &r.buf)
		var c int
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return true
		case err != nil:
			fail(fmt.Errorf("cgroup: %w", err))
			c, _ = r.cpusets.failed(p)
		default:
			if c, err = parseCPUSet(b); err != nil {
				fail(parseError(p, b, err))
				c, _ = r.cpusets.failed(p)
			} else {
				r.cpusets.ok(p, c)
			}
		}
		n = c
		return c == 0
	})
	return n
}
