// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCPUSet(t *testing.T) {
	tests := []struct {
		in      string
		want    int
		wantErr bool
	}{
		{in: "0-3,5,7-8\n", want: 7},
		{in: "0", want: 1},
		{in: "0-63", want: 64},
		{in: "2,4,6", want: 3},
		{in: "", want: 0},
		{in: "\n", want: 0},
		{in: "3-1", wantErr: true},
		{in: "0-", wantErr: true},
		{in: "-3", wantErr: true},
		{in: "0,,1", wantErr: true},
		{in: "0,", wantErr: true},
		{in: "a", wantErr: true},
		{in: "0 - 3", wantErr: true},
		{in: "0-99999999999", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseCPUSet([]byte(tt.in))
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseCPUMax(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr string
	}{
		{in: "150000 100000\n", want: 1.5},
		{in: "50000 100000", want: 0.5},
		{in: "100000 100000", want: 1},
		{in: "max 100000\n", want: 0},
		{in: "max", want: 0},
		{in: "0 100000", wantErr: "quota: must be > 0"},
		{in: "100000 0", wantErr: "period: must be > 0"},
		{in: "max 0", wantErr: "period: must be > 0"},
		{in: "-1 100000", wantErr: "quota: invalid number"},
		{in: "100000 -1", wantErr: "period: invalid number"},
		{in: "150000", wantErr: "want"},
		{in: "", wantErr: "want"},
		{in: "max max", wantErr: "period"},
		{in: "99999999999999999999 100000", wantErr: "out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseCPUMax([]byte(tt.in))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.InDelta(t, tt.want, got, 1e-12)
		})
	}
}

func TestParseV1(t *testing.T) {
	t.Run("quota", func(t *testing.T) {
		q, none, err := parseV1Quota([]byte("-1\n"))
		require.NoError(t, err)
		assert.True(t, none)
		assert.Zero(t, q)

		q, none, err = parseV1Quota([]byte("50000\n"))
		require.NoError(t, err)
		assert.False(t, none)
		assert.Equal(t, int64(50000), q)

		for _, bad := range []string{"0", "-2", "- 1", "", "1.5", "--1"} {
			_, _, err = parseV1Quota([]byte(bad))
			assert.Error(t, err, bad)
		}
	})
	t.Run("period", func(t *testing.T) {
		p, err := parseV1Period([]byte("100000\n"))
		require.NoError(t, err)
		assert.Equal(t, int64(100000), p)
		for _, bad := range []string{"0", "-1", "x", ""} {
			_, err = parseV1Period([]byte(bad))
			assert.Error(t, err, bad)
		}
	})
	t.Run("memory limit", func(t *testing.T) {
		tests := []struct {
			in      string
			want    uint64
			wantErr bool
		}{
			{in: "268435456\n", want: 256 << 20},
			{in: "9223372036854771712\n", want: 0}, // 4 KiB pages sentinel
			{in: "9223372036854710272\n", want: 0}, // 64 KiB pages sentinel
			{in: "1152921504606846976\n", want: 0}, // 1<<60
			{in: "1152921504606846975\n", want: 1<<60 - 1},
			{in: "18446744073709551615\n", want: 0}, // above int64: unlimited
			{in: "-1", wantErr: true},
			{in: "0", wantErr: true},
			{in: "12 MiB", wantErr: true},
			{in: "99999999999999999999999", wantErr: true},
		}
		for _, tt := range tests {
			got, err := parseV1MemoryLimit([]byte(tt.in))
			if tt.wantErr {
				require.Error(t, err, tt.in)
				continue
			}
			require.NoError(t, err, tt.in)
			assert.Equal(t, tt.want, got, tt.in)
		}
	})
}

func TestParseMemoryMax(t *testing.T) {
	v, err := parseMemoryMax([]byte("max\n"))
	require.NoError(t, err)
	assert.Zero(t, v)
	v, err = parseMemoryMax([]byte("536870912\n"))
	require.NoError(t, err)
	assert.Equal(t, uint64(512<<20), v)
	for _, bad := range []string{"0", "-1", "", "max max", "1G"} {
		_, err = parseMemoryMax([]byte(bad))
		assert.Error(t, err, bad)
	}
}

func TestParseKeyValue(t *testing.T) {
	const stat = "anon 10\nfile 20\ninactive_file 30\ntotal_inactive_file 40\nactive_file 50"
	tests := []struct {
		key     string
		want    uint64
		wantErr error
	}{
		{key: "inactive_file", want: 30},
		{key: "total_inactive_file", want: 40},
		{key: "active_file", want: 50}, // last line without newline
		{key: "anon", want: 10},
		{key: "inactive", wantErr: errNoKey}, // a prefix is not the key
		{key: "missing", wantErr: errNoKey},
	}
	for _, tt := range tests {
		got, err := parseKeyValue([]byte(stat), tt.key)
		if tt.wantErr != nil {
			require.ErrorIs(t, err, tt.wantErr, tt.key)
			continue
		}
		require.NoError(t, err, tt.key)
		assert.Equal(t, tt.want, got, tt.key)
	}
	_, err := parseKeyValue([]byte("usage_usec \n"), "usage_usec")
	require.ErrorIs(t, err, errEmpty)
	_, err = parseKeyValue([]byte("usage_usec 1 2\n"), "usage_usec")
	require.ErrorIs(t, err, errSyntax)
}

func TestParseUintInt(t *testing.T) {
	v, err := parseUint([]byte(" 18446744073709551615\n"))
	require.NoError(t, err)
	assert.Equal(t, uint64(18446744073709551615), v)
	_, err = parseUint([]byte("18446744073709551616"))
	require.ErrorIs(t, err, errRange)

	i, err := parseInt([]byte("-9223372036854775808"))
	require.NoError(t, err)
	assert.Equal(t, int64(-9223372036854775808), i)
	_, err = parseInt([]byte("9223372036854775808"))
	require.ErrorIs(t, err, errRange)
	_, err = parseInt([]byte("-"))
	require.ErrorIs(t, err, errEmpty)
}

func TestParseMountinfo(t *testing.T) {
	const mi = `22 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:10 master:3 - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 /kubepods/pod1 /sys/fs/cgroup/with\040space rw - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate

`
	got, err := parseMountinfo([]byte(mi))
	require.NoError(t, err)
	require.Len(t, got, 4)
	assert.Equal(t, mount{root: "/", point: "/sys/fs/cgroup/cpu,cpuacct", opts: []string{"rw", "cpu", "cpuacct"}}, got[0])
	assert.Equal(t, "/kubepods/pod1", got[1].root)
	assert.Equal(t, "/sys/fs/cgroup/with space", got[1].point)
	assert.True(t, got[1].has("memory"))
	assert.False(t, got[2].has("cpu"))
	assert.True(t, got[3].v2)

	for _, bad := range []string{
		"29 23 0:26 / /sys/fs/cgroup rw - cgroup2\n",          // no source / super options
		"29 23 0:26 / /sys/fs/cgroup rw cgroup2 cgroup2 rw\n", // no separator
		"29 23\n",
		"29 23 0:26 rel /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", // relative root
	} {
		_, err := parseMountinfo([]byte(bad))
		assert.Error(t, err, bad)
	}
}

// TestParseMountinfoOddLines: lines the kernel writes that a naive split
// gets wrong, and malformed lines, are skipped without losing the cgroup
// mounts around them.
func TestParseMountinfoOddLines(t *testing.T) {
	const v2 = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
	v2Mount := mount{root: "/", point: "/sys/fs/cgroup", v2: true, opts: []string{"rw", "nsdelegate"}}
	f := func(in string, want []mount) {
		t.Helper()
		got, err := parseMountinfo([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	// An empty mount source is written as two spaces.
	f("24 23 0:45 / /run/secrets rw,relatime shared:7 - tmpfs  rw,size=65536k\n"+v2, []mount{v2Mount})
	f("32 31 0:29 / /sys/fs/cgroup/memory rw - cgroup  rw,memory\n", []mount{
		{root: "/", point: "/sys/fs/cgroup/memory", opts: []string{"rw", "memory"}},
	})
	// Escapes in the root, the mount point and the source.
	f(`33 31 0:30 /a\040b /sys/fs/cgroup/x\011y\134z rw - cgroup my\040src rw,cpu`+"\n", []mount{
		{root: "/a b", point: "/sys/fs/cgroup/x\ty\\z", opts: []string{"rw", "cpu"}},
	})
	// No optional field, and many, including one that is not tag:value.
	f("29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", []mount{{root: "/", point: "/sys/fs/cgroup", v2: true, opts: []string{"rw"}}})
	f("29 23 0:26 / /c rw shared:4 master:1 propagate_from:1 unbindable - cgroup2 none rw\n", []mount{{root: "/", point: "/c", v2: true, opts: []string{"rw"}}})
	// Malformed lines of other types, or of unknown type, are skipped.
	f("25 23 0:47 / /mnt/new rw shared:9 no separator here\n"+v2, []mount{v2Mount})
	f("garbage\n\n"+v2+"26 23 0:48 / /mnt rw - \n", []mount{v2Mount})
	f("26 23 0:48 / /mnt rw -  tmpfs rw\n"+v2, []mount{v2Mount})
	// A malformed cgroup line is skipped when a usable one remains.
	f("27 23 0:48 rel /sys/fs/cgroup/odd rw - cgroup2 cgroup2 rw\n"+v2, []mount{v2Mount})
	f("28 23 0:49 / /sys/fs/cgroup/cpu rw - cgroup cgroup \n"+v2, []mount{v2Mount})
	f("28 23 0:49 / /sys/fs/cgroup/cpu rw - cgroup cgroup\n"+v2, []mount{v2Mount})
	// No cgroup at all is not an error here (NewReader reports it).
	f("22 1 0:21 / /proc rw - proc proc rw\n", nil)
	f("", nil)

	// Nothing usable: the first skipped line is the error.
	fErr := func(in, want string) {
		t.Helper()
		_, err := parseMountinfo([]byte(in))
		require.ErrorContains(t, err, want, in)
	}
	fErr("22 1 0:21 / /proc rw - proc proc rw\n27 23 0:48 rel /c rw - cgroup2 cgroup2 rw\n", "line 2: root and mount point must be absolute")
	fErr("garbage\n28 23 0:49 / /c rw - cgroup cgroup\n", "line 1: malformed")
}

func TestUnescapeMountField(t *testing.T) {
	assert.Equal(t, "a b\tc\\d", unescapeMountField(`a\040b\011c\134d`))
	assert.Equal(t, `a\04`, unescapeMountField(`a\04`)) // truncated escape kept
	assert.Equal(t, `a\x`, unescapeMountField(`a\x`))
	assert.Equal(t, `a\400`, unescapeMountField(`a\400`), "does not fit in a byte")
}

func TestParseProcCgroup(t *testing.T) {
	got, err := parseProcCgroup([]byte("12:memory:/a:b\n3:cpu,cpuacct:/kubepods/pod1\n1:name=systemd:/\n0::/x\n"))
	require.NoError(t, err)
	require.Len(t, got, 4)
	p, ok := v1Path(got, "memory")
	assert.True(t, ok)
	assert.Equal(t, "/a:b", p)
	p, ok = v1Path(got, "cpuacct")
	assert.True(t, ok)
	assert.Equal(t, "/kubepods/pod1", p)
	_, ok = v1Path(got, "cpuset")
	assert.False(t, ok)
	p, ok = v2Path(got)
	assert.True(t, ok)
	assert.Equal(t, "/x", p)
}

// TestParseProcCgroupOddLines: a line that cannot be parsed is skipped
// without losing the hierarchies around it; only a file with no usable line
// fails, naming its first bad line.
func TestParseProcCgroupOddLines(t *testing.T) {
	v2 := procCgroup{id: "0", path: "/pod1/ctr"}
	memory := procCgroup{id: "4", controllers: []string{"memory"}, path: "/process_api/abc"}
	f := func(in string, want []procCgroup) {
		t.Helper()
		got, err := parseProcCgroup([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	f("", nil)
	f("\n\n", nil)
	f("0::/pod1/ctr", []procCgroup{v2})
	// A named hierarchy whose path holds a newline shows as two lines.
	f("5:name=odd:/a\nb\n0::/pod1/ctr\n", []procCgroup{{id: "5", controllers: []string{"name=odd"}, path: "/a"}, v2})
	f("5:name=odd:/a\n:b\n4:memory:/process_api/abc\n", []procCgroup{{id: "5", controllers: []string{"name=odd"}, path: "/a"}, memory})
	// Each kind of malformed line, before and after good ones.
	f("garbage\n4:memory:/process_api/abc\n0::/pod1/ctr\n", []procCgroup{memory, v2})
	f("4:memory:/process_api/abc\n1:cpu\n0::/pod1/ctr\n", []procCgroup{memory, v2})
	f("x:cpu:/\n0::/pod1/ctr\n", []procCgroup{v2})
	f(":cpu:/\n0::/pod1/ctr\n", []procCgroup{v2})
	f("-1:cpu:/\n0::/pod1/ctr\n", []procCgroup{v2})
	f("0::/pod1/ctr\n1:cpu:relative\n", []procCgroup{v2})
	f("0::/pod1/ctr\n2:cpuacct:\n", []procCgroup{v2})

	fErr := func(in, want string) {
		t.Helper()
		got, err := parseProcCgroup([]byte(in))
		require.ErrorContains(t, err, want, in)
		assert.Nil(t, got, in)
	}
	fErr("garbage", `line 1: malformed: want "hierarchy:controllers:path": "garbage"`)
	fErr("1:cpu", "line 1: malformed")
	fErr("x:cpu:/", "line 1: hierarchy id is not a number")
	fErr(":cpu:/", "line 1: hierarchy id is not a number")
	fErr("\n1:cpu:relative\n", "line 2: path is not absolute")
	fErr("1:cpu:relative\nx:cpu:/\n", "line 1: path is not absolute")
}

func TestRelPath(t *testing.T) {
	tests := []struct {
		root, path string
		want       string
		ok         bool
	}{
		{root: "/", path: "/", want: "/", ok: true},
		{root: "/", path: "/kubepods/pod1/ctr", want: "/kubepods/pod1/ctr", ok: true},
		{root: "/kubepods/pod1", path: "/kubepods/pod1/ctr", want: "/ctr", ok: true},
		{root: "/kubepods/pod1", path: "/kubepods/pod1", want: "/", ok: true},
		{root: "/kubepods/pod1", path: "/kubepods/pod10/ctr"}, // not a path prefix
		{root: "/kubepods/pod1", path: "/other"},              // outside the root
		{root: "/", path: "/../sibling"},                      // outside the namespace
		{root: "/..", path: "/"},                              // mount from outside the namespace
		{root: "/docker/abc/", path: "/docker/abc/x/", want: "/x", ok: true},
	}
	for _, tt := range tests {
		got, ok := relPath(tt.root, tt.path)
		assert.Equal(t, tt.ok, ok, "%s %s", tt.root, tt.path)
		assert.Equal(t, tt.want, got, "%s %s", tt.root, tt.path)
	}
}

func TestPickMount(t *testing.T) {
	mounts := []mount{
		{root: "/other", point: "/a", opts: []string{"memory"}},
		{root: "/", point: "/b", opts: []string{"memory"}},
		{root: "/kubepods", point: "/c", opts: []string{"memory"}},
		{root: "/", point: "/d", v2: true},
	}
	m, ok := findV1Mount(mounts, "memory", "/kubepods/pod1")
	require.True(t, ok)
	assert.Equal(t, "/c", m.point, "the longest root holding the path wins")
	m, ok = findV1Mount(mounts, "memory", "/x")
	require.True(t, ok)
	assert.Equal(t, "/b", m.point)
	_, ok = findV1Mount(mounts, "cpu", "/")
	assert.False(t, ok)
	m, ok = findV1Mount(mounts[:1], "memory", "/x")
	require.True(t, ok, "a mount not holding the path is still the only one")
	assert.Equal(t, "/a", m.point)
	m, ok = findV2Mount(mounts, "/")
	require.True(t, ok)
	assert.Equal(t, "/d", m.point)
}
