// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCreateRunDir: a run gets <date>-<name> under the runs folder, and a
// second run of the day a folder of its own rather than the first one's.
func TestCreateRunDir(t *testing.T) {
	root := filepath.Join(t.TempDir(), "bench", "runs")
	now := time.Date(2026, 12, 3, 23, 59, 0, 0, time.FixedZone("east", 3600))
	first, err := CreateRunDir(root, "fleet-http", now)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(root, "2026-12-03-fleet-http"), first, "the UTC date")
	second, err := CreateRunDir(root, "fleet-http", now)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(root, "2026-12-03-fleet-http-2"), second)
	for _, d := range []string{first, second} {
		st, err := os.Stat(d)
		require.NoError(t, err)
		assert.True(t, st.IsDir())
	}
	_, err = CreateRunDir(root, "../elsewhere", now)
	assert.Error(t, err)
}

// TestRunDir: a run named on the command line goes where its folder names
// from the repository root, whichever folder the binary runs in (the soak
// test runs in its package's); an absolute folder stays as given; without
// one the run gets a new folder under the root's runs folder.
func TestRunDir(t *testing.T) {
	root := t.TempDir()
	now := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	abs := filepath.Join(t.TempDir(), "elsewhere")
	f := func(out, want string) {
		t.Helper()
		got, err := RunDir(root, out, "soak", now)
		require.NoError(t, err)
		assert.Equal(t, want, got)
		st, err := os.Stat(got)
		require.NoError(t, err)
		assert.True(t, st.IsDir())
	}
	f("", filepath.Join(root, "bench", "runs", "2026-12-07-soak"))
	f("bench/runs/mine", filepath.Join(root, "bench", "runs", "mine"))
	f(abs, abs)
}

// TestRunInfoRoundTrip: what machine.txt records about the run (date,
// commit, command) is what promotion reads back from a report quoting it.
func TestRunInfoRoundTrip(t *testing.T) {
	args := []string{"/tmp/go-build123/b001/overload.test", "-soak.rate=1500", "-throttle-config", "a b.yaml", "-x", "it's"}
	info := MachineInfo(args)
	report := "# Overload run\n\n```\n" + info + "```\n\n| scenario |\n|---|\n"
	ri := ParseRunInfo(report)
	assert.Equal(t, `overload.test -soak.rate=1500 -throttle-config 'a b.yaml' -x 'it'\''s'`, ri.Command)
	_, err := time.Parse(time.RFC3339, ri.Date)
	require.NoError(t, err, ri.Date)
	// The test runs inside the repository's checkout.
	assert.Regexp(t, `^[0-9a-f]{7,}( with uncommitted changes)?$`, ri.Commit)
	assert.Equal(t, RunInfo{}, ParseRunInfo("# a report from before runs recorded anything\n"))
}

func TestCommandLine(t *testing.T) {
	wd, err := os.Getwd()
	require.NoError(t, err)
	assert.Equal(t, "bin/overload -d 40s", commandLine([]string{filepath.Join(wd, "bin", "overload"), "-d", "40s"}), "the program as named from the working folder")
	assert.Equal(t, "bin/fleet -protocol grpc", commandLine([]string{"bin/fleet", "-protocol", "grpc"}))
	assert.Equal(t, "fleet -scenarios throttle,reference -factor 1.5 ''", commandLine([]string{"/elsewhere/fleet", "-scenarios", "throttle,reference", "-factor", "1.5", ""}))
	// Paths below the working folder as a reader runs them from there.
	assert.Equal(t, "bin/fleet -throttle _build/otelcol-throttle -out=bench/runs/x /elsewhere/otelcol",
		commandLine([]string{filepath.Join(wd, "bin/fleet"), "-throttle", filepath.Join(wd, "_build/otelcol-throttle"), "-out=" + filepath.Join(wd, "bench/runs/x"), "/elsewhere/otelcol"}))
}
