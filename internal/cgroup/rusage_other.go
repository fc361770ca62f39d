// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !unix

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"errors"
	"time"
)

// errNoRusage is returned where getrusage does not exist (Windows, wasm):
// the process fallback then has no CPU reading and the sampler marks the
// signal invalid.
var errNoRusage = errors.New("cgroup: getrusage is not available on this platform")

func rusageCPU() (time.Duration, error) { return 0, errNoRusage }
