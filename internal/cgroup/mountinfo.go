package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
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
// The number of optional fields before "-" varies, so the line is split on
// that separator. A line that does not have the shape is an error: the kernel
// never writes one, so the file is not mountinfo.
func parseMountinfo(data []byte) ([]mount, error) {
	var mounts []mount
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		sep := -1
		for j := 6; j < len(f); j++ {
			if f[j] == "-" {
				sep = j
				break
			}
		}
		if sep < 0 || len(f) < sep+4 {
			return nil, fmt.Errorf("mountinfo line %d: malformed: %q", i+1, line)
		}
		fstype := f[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		root, point := unescapeMountField(f[3]), unescapeMountField(f[4])
		if !strings.HasPrefix(root, "/") || !strings.HasPrefix(point, "/") {
			return nil, fmt.Errorf("mountinfo line %d: root and mount point must be absolute: %q", i+1, line)
		}
		mounts = append(mounts, mount{
			root:  root,
			point: point,
			v2:    fstype == "cgroup2",
			opts:  strings.Split(f[sep+3], ","),
		})
	}
	return mounts, nil
}

// unescapeMountField undoes the octal escapes the kernel writes for space,
// tab, newline and backslash in mountinfo paths ("\040" for a space).
func unescapeMountField(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
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

// parseProcCgroup parses /proc/self/cgroup. The path keeps any ':' it
// contains (only the first two separate fields).
func parseProcCgroup(data []byte) ([]procCgroup, error) {
	var out []procCgroup
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			return nil, fmt.Errorf("cgroup line %d: want \"id:controllers:path\": %q", i+1, line)
		}
		if f[0] == "" || strings.Trim(f[0], "0123456789") != "" {
			return nil, fmt.Errorf("cgroup line %d: hierarchy id %q is not a number", i+1, f[0])
		}
		if !strings.HasPrefix(f[2], "/") {
			return nil, fmt.Errorf("cgroup line %d: path %q is not absolute", i+1, f[2])
		}
		var ctrls []string
		if f[1] != "" {
			ctrls = strings.Split(f[1], ",")
		}
		out = append(out, procCgroup{id: f[0], controllers: ctrls, path: f[2]})
	}
	return out, nil
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
