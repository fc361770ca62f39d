// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// mount is one cgroup or cgroup2 line of /proc/self/mountinfo.
type mount struct {
	// root is the mount's root field: the directory of the cgroup hierarchy
	// that appears at point. It is "/" unless the hierarchy was mounted from
	// inside a sub-tree (some container runtimes do that).
	root string
	// point is the mount point as the process sees it, e.g. /sys/fs/cgroup/cpu.
	point string
	// v2 is true for cgroup2, false for cgroup (v1).
	v2 bool
	// opts are the super options: for v1 they name the controllers
	// ("rw,cpu,cpuacct"); the other entries (rw, name=systemd, ...) never
	// equal a controller name, so a plain membership test is enough.
	opts []string
}

func (m mount) has(controller string) bool {
	for _, o := range m.opts {
		if o == controller {
			return true
		}
	}
	return false
}

// parseMountinfo returns the cgroup and cgroup2 mounts listed in
// /proc/self/mountinfo (proc(5)):
//
//	36 35 98:0 /root /mnt/point rw,noatime master:1 - cgroup cgroup rw,cpu,cpuacct
//
// Six fields (ID, parent ID, major:minor, root, mount point, mount options)
// are followed by zero or more optional fields ("master:1"), ended by a
// field that is a single "-", then by the file system type, the mount source
// and the super options. Fields are separated by single spaces (the kernel
// writes a space inside a field as \040), so an empty field shows as two
// spaces: the source is empty for some mounts ("- tmpfs  rw").
//
// Lines of other file system types are not examined further. A malformed
// line is skipped rather than failing the file, cgroup line or not, because
// each controller's mount is its own line and one odd line must not switch
// off all of them; only when no usable cgroup mount remains is the first
// skipped line returned as the error, being then the likely cause.
func parseMountinfo(data []byte) ([]mount, error) {
	var mounts []mount
	var skipped error
	for i, line := range strings.Split(string(data), "\n") {
		if line == "" {
			continue
		}
		m, isCgroup, err := parseMountinfoLine(line)
		switch {
		case err != nil:
			if skipped == nil {
				skipped = fmt.Errorf("mountinfo line %d: %w: %q", i+1, err, line)
			}
		case isCgroup:
			mounts = append(mounts, m)
		}
	}
	if len(mounts) == 0 && skipped != nil {
		return nil, skipped
	}
	return mounts, nil
}

var (
	errNoSeparator = errors.New(`malformed: no "-" field after the optional fields`)
	errShortLine   = errors.New("malformed: too few fields")
	errRelative    = errors.New("root and mount point must be absolute")
)

// parseMountinfoLine parses one line. isCgroup is false, with no error, for a
// well-formed line of another file system type; such a line's other fields
// are not checked.
func parseMountinfoLine(line string) (m mount, isCgroup bool, err error) {
	f := strings.Split(line, " ")
	// Fields 1 to 6 come before the optional fields.
	const optional = 6
	sep := -1
	for j := optional; j < len(f); j++ {
		if f[j] == "-" {
			sep = j
			break
		}
	}
	if sep < 0 {
		return mount{}, false, errNoSeparator
	}
	if sep+1 == len(f) || f[sep+1] == "" {
		return mount{}, false, errShortLine
	}
	fstype := f[sep+1]
	if fstype != "cgroup" && fstype != "cgroup2" {
		return mount{}, false, nil
	}
	// Type, source (possibly empty) and super options.
	if len(f) < sep+4 || f[sep+3] == "" {
		return mount{}, false, errShortLine
	}
	root, point := unescapeMountField(f[3]), unescapeMountField(f[4])
	if !strings.HasPrefix(root, "/") || !strings.HasPrefix(point, "/") {
		return mount{}, false, errRelative
	}
	return mount{
		root:  root,
		point: point,
		v2:    fstype == "cgroup2",
		opts:  strings.Split(f[sep+3], ","),
	}, true, nil
}

// unescapeMountField undoes the octal escapes the kernel writes for space,
// tab, newline and backslash in mountinfo paths ("\040" for a space). An
// escape whose first digit is above 3 is kept as it is: it does not fit in a
// byte, so the kernel never writes one.
func unescapeMountField(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] <= '3' && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			v := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(v)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// procCgroup is one line of /proc/self/cgroup: "hierarchy:controllers:path".
// v1 lines name their controllers ("4:memory:/docker/abc"); the v2 line is
// "0::/path".
type procCgroup struct {
	id          string
	controllers []string
	path        string
}

// parseProcCgroup parses /proc/self/cgroup (cgroups(7)), a line per
// hierarchy:
//
//	4:memory:/kubepods/pod1
//	0::/kubepods/pod1
//
// The path keeps any ':' it contains (only the first two separate fields).
// As in parseMountinfo, a malformed line is skipped rather than failing the
// file: each hierarchy is its own line, and one odd line (a cgroup path
// holding a newline shows as two) must not switch off the others; only when
// no usable line remains is the first skipped line returned as the error.
func parseProcCgroup(data []byte) ([]procCgroup, error) {
	var out []procCgroup
	var skipped error
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		l, err := parseProcCgroupLine(line)
		if err != nil {
			if skipped == nil {
				skipped = fmt.Errorf("cgroup line %d: %w: %q", i+1, err, line)
			}
			continue
		}
		out = append(out, l)
	}
	if len(out) == 0 && skipped != nil {
		return nil, skipped
	}
	return out, nil
}

var (
	errCgroupFields    = errors.New(`malformed: want "hierarchy:controllers:path"`)
	errCgroupHierarchy = errors.New("hierarchy id is not a number")
	errCgroupPath      = errors.New("path is not absolute")
)

func parseProcCgroupLine(line string) (procCgroup, error) {
	f := strings.SplitN(line, ":", 3)
	switch {
	case len(f) != 3:
		return procCgroup{}, errCgroupFields
	case f[0] == "" || strings.Trim(f[0], "0123456789") != "":
		return procCgroup{}, errCgroupHierarchy
	case !strings.HasPrefix(f[2], "/"):
		return procCgroup{}, errCgroupPath
	}
	var ctrls []string
	if f[1] != "" {
		ctrls = strings.Split(f[1], ",")
	}
	return procCgroup{id: f[0], controllers: ctrls, path: f[2]}, nil
}

// v1Path returns the process's path in the v1 hierarchy holding controller.
func v1Path(lines []procCgroup, controller string) (string, bool) {
	for _, l := range lines {
		for _, c := range l.controllers {
			if c == controller {
				return l.path, true
			}
		}
	}
	return "", false
}

// v2Path returns the process's path in the unified hierarchy.
func v2Path(lines []procCgroup) (string, bool) {
	for _, l := range lines {
		if l.id == "0" && len(l.controllers) == 0 {
			return l.path, true
		}
	}
	return "", false
}

// relPath makes the process's cgroup path relative to a mount's root field:
// a hierarchy mounted from /kubepods/pod1 shows /kubepods/pod1/ctr at
// <mount point>/ctr. ok is false when the path is not inside the mount's
// root or climbs out of it with "..": a process in a cgroup namespace sees
// paths like /../sibling for cgroups outside its namespace, and those are
// not below the mount point at all.
func relPath(mountRoot, cgPath string) (rel string, ok bool) {
	if hasDotDot(cgPath) || hasDotDot(mountRoot) {
		return "", false
	}
	mountRoot, cgPath = path.Clean(mountRoot), path.Clean(cgPath)
	switch {
	case mountRoot == "/":
		return cgPath, true
	case cgPath == mountRoot:
		return "/", true
	case strings.HasPrefix(cgPath, mountRoot+"/"):
		return cgPath[len(mountRoot):], true
	}
	return "", false
}

func hasDotDot(p string) bool {
	return strings.Contains("/"+p+"/", "/../")
}

// findV1Mount returns the v1 mount of controller that holds cgPath. When
// several mounts carry the controller (bind mounts), the one whose root
// contains the path wins, the longest root first; otherwise the first one.
func findV1Mount(mounts []mount, controller, cgPath string) (mount, bool) {
	return pickMount(mounts, cgPath, func(m mount) bool { return !m.v2 && m.has(controller) })
}

// findV2Mount is findV1Mount for the unified hierarchy.
func findV2Mount(mounts []mount, cgPath string) (mount, bool) {
	return pickMount(mounts, cgPath, func(m mount) bool { return m.v2 })
}

func pickMount(mounts []mount, cgPath string, match func(mount) bool) (mount, bool) {
	var best mount
	found, bestInside := false, false
	for _, m := range mounts {
		if !match(m) {
			continue
		}
		_, inside := relPath(m.root, cgPath)
		switch {
		case !found:
		case inside && !bestInside:
		case inside && bestInside && len(m.root) > len(best.root):
		default:
			continue
		}
		best, found, bestInside = m, true, inside
	}
	return best, found
}
