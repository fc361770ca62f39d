// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup

import (
	"math"
	"strings"
	"testing"
)

// The fuzz targets check that no input panics and that what the parsers
// accept keeps their invariants. Seeds live in testdata/fuzz/<target>/.

func FuzzParseMountinfo(f *testing.F) {
	f.Add([]byte("32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct\n"))
	f.Add([]byte("29 23 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"))
	f.Add([]byte("24 23 0:45 / /run/secrets rw shared:7 - tmpfs  rw,size=65536k\n"))
	// A good cgroup line, added after any input: whatever came before must
	// not make the file unusable.
	const good = "29 23 0:26 /a\\040b /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate"
	f.Fuzz(func(t *testing.T, data []byte) {
		mounts, err := parseMountinfo(data)
		if err == nil {
			for _, m := range mounts {
				if !strings.HasPrefix(m.root, "/") || !strings.HasPrefix(m.point, "/") {
					t.Fatalf("accepted a relative path: %+v", m)
				}
				if len(m.opts) == 0 {
					t.Fatalf("no super options: %+v", m)
				}
			}
		}
		mounts, err = parseMountinfo(append(append(append([]byte(nil), data...), '\n'), good...))
		if err != nil {
			t.Fatalf("one good cgroup line after %q: %v", data, err)
		}
		last := mounts[len(mounts)-1]
		if last.root != "/a b" || last.point != "/sys/fs/cgroup" || !last.v2 {
			t.Fatalf("good line after %q parsed as %+v", data, last)
		}
	})
}

func FuzzParseProcCgroup(f *testing.F) {
	f.Add([]byte("12:memory:/kubepods/pod1\n3:cpu,cpuacct:/\n0::/\n"))
	f.Add([]byte("0::/a:b\n"))
	f.Add([]byte("5:name=odd:/a\nb\n1:cpu\n0::/\n"))
	// A good line, added after any input: whatever came before must not
	// make the file unusable.
	const good = "0::/a:b c"
	f.Fuzz(func(t *testing.T, data []byte) {
		withGood, err := parseProcCgroup(append(append(append([]byte(nil), data...), '\n'), good...))
		if err != nil {
			t.Fatalf("one good line after %q: %v", data, err)
		}
		if last := withGood[len(withGood)-1]; last.id != "0" || len(last.controllers) != 0 || last.path != "/a:b c" {
			t.Fatalf("good line after %q parsed as %+v", data, last)
		}
		lines, err := parseProcCgroup(data)
		if err != nil {
			return
		}
		for _, l := range lines {
			if !strings.HasPrefix(l.path, "/") || l.id == "" {
				t.Fatalf("accepted %+v", l)
			}
			// Resolving against any root must not panic and must stay
			// absolute.
			for _, root := range []string{"/", "/kubepods", l.path} {
				if rel, ok := relPath(root, l.path); ok && !strings.HasPrefix(rel, "/") {
					t.Fatalf("relPath(%q, %q) = %q", root, l.path, rel)
				}
			}
		}
	})
}

func FuzzParseCPUMax(f *testing.F) {
	f.Add([]byte("150000 100000\n"))
	f.Add([]byte("max 100000"))
	f.Add([]byte("0 0"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cores, err := parseCPUMax(data)
		if err != nil {
			if cores != 0 {
				t.Fatalf("error with cores %v", cores)
			}
			return
		}
		if cores < 0 || math.IsNaN(cores) || math.IsInf(cores, 0) {
			t.Fatalf("cores %v from %q", cores, data)
		}
		// The v1 pair must agree on "no quota" vs an error.
		_, _, _ = parseV1Quota(data)
		_, _ = parseV1Period(data)
	})
}

func FuzzParseCPUSet(f *testing.F) {
	f.Add([]byte("0-3,5,7-8\n"))
	f.Add([]byte("0"))
	f.Add([]byte("3-1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := parseCPUSet(data)
		if err != nil {
			return
		}
		if n < 0 || n > (maxCPUSetIndex+1)*(strings.Count(string(data), ",")+1) {
			t.Fatalf("count %d from %q", n, data)
		}
		if n == 0 && len(trimSpace(data)) != 0 {
			t.Fatalf("non-empty list %q counted 0", data)
		}
	})
}

func FuzzParseMemoryStat(f *testing.F) {
	f.Add([]byte("anon 1\ninactive_file 30\ntotal_inactive_file 40\n"), "inactive_file")
	f.Add([]byte("usage_usec 5"), "usage_usec")
	f.Fuzz(func(t *testing.T, data []byte, key string) {
		v, err := parseKeyValue(data, key)
		if err != nil && v != 0 {
			t.Fatalf("error with value %d", v)
		}
		_, _ = parseMemoryMax(data)
		_, _ = parseV1MemoryLimit(data)
		if u, err := parseUint(data); err == nil {
			if i, err := parseInt(data); err == nil && uint64(i) != u {
				t.Fatalf("parseInt %d != parseUint %d for %q", i, u, data)
			}
		}
	})
}

func FuzzParseProcStat(f *testing.F) {
	f.Add([]byte("4242 (otel col) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0\n"))
	f.Add([]byte("1 (x) S"))
	f.Fuzz(func(_ *testing.T, data []byte) {
		_, _ = parseProcStat(data)
		_, _ = parseStatm(data)
	})
}
