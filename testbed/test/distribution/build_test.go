// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package distribution

import (
	"errors"
	"testing"

	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

var errExitTimeout = errors.New("process did not exit in time")

// distribution returns the path of the otelcol-throttle binary built with
// ocb from this checkout (cached by a hash of its sources, shared with the
// overload test), or skips the test without a go toolchain.
func distribution(t *testing.T) string {
	t.Helper()
	return distbuild.Binary(t)
}

func repoRoot() (string, error)       { return distbuild.RepoRoot() }
func tail(s string, lines int) string { return distbuild.Tail(s, lines) }
