// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RunsDir is where a benchmark writes a run unless told otherwise (-out),
// relative to the repository root. It is git-ignored: a run becomes the
// baseline in bench/results only when promoted (make promote).
const RunsDir = "bench/runs"

// CreateRunDir creates and returns a new folder for a run under root,
// named <UTC date>-<name>, or <UTC date>-<name>-2, -3, ... when a run of
// that name already has the day's folder.
func CreateRunDir(root, name string, now time.Time) (string, error) {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return "", fmt.Errorf("run name %q: want a plain folder name", name)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	base := now.UTC().Format("2006-01-02") + "-" + name
	for n := 1; ; n++ {
		dir := filepath.Join(root, base)
		if n > 1 {
			dir += "-" + strconv.Itoa(n)
		}
		err := os.Mkdir(dir, 0o755)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
}

// RunDir returns the folder a run writes to and creates it: out when
// given, taken from root unless absolute, or else a new folder of
// CreateRunDir under root's runs folder. root is the repository root as
// the running binary sees it: "." for the commands make runs from there.
func RunDir(root, out, name string, now time.Time) (string, error) {
	if out == "" {
		return CreateRunDir(filepath.Join(root, RunsDir), name, now)
	}
	if !filepath.IsAbs(out) {
		out = filepath.Join(root, out)
	}
	return out, os.MkdirAll(out, 0o755)
}

// RunContext bounds a whole run to budget and ends it early on Ctrl-C or
// SIGTERM, so that a benchmark always stops by itself and cleans up.
func RunContext(budget time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	return ctx, func() {
		stop()
		cancel()
	}
}

// The labels of machine.txt's lines that promotion reads back.
const (
	labelDate    = "date (UTC)"
	labelCommit  = "commit"
	labelCommand = "command"
)

// Commit names the commit the run's binaries were built from: the
// checkout's HEAD, marked when tracked files other than documents and
// results differ from it ("unknown" outside a git checkout). The make
// targets rebuild the binaries from the checkout before a run.
func Commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	commit := strings.TrimSpace(string(out))
	// Exit status 1: differences.
	err = exec.Command("git", "diff", "--quiet", "HEAD", "--", ":(top)", ":(top,exclude)*.md", ":(top,exclude)bench/results").Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 {
		commit += " with uncommitted changes"
	}
	return commit
}

// RunInfo is what a run's report records about where it came from.
type RunInfo struct {
	Date    string // RFC 3339, UTC
	Commit  string // "" in runs from before it was recorded
	Command string
}

// ParseRunInfo reads the lines MachineInfo wrote, wherever they are in
// text (a report quotes machine.txt at its top).
func ParseRunInfo(text string) RunInfo {
	var ri RunInfo
	for _, l := range strings.Split(text, "\n") {
		for label, field := range map[string]*string{labelDate: &ri.Date, labelCommit: &ri.Commit, labelCommand: &ri.Command} {
			if v, ok := strings.CutPrefix(l, label+" "); ok && *field == "" {
				*field = strings.TrimSpace(v)
			}
		}
	}
	return ri
}
