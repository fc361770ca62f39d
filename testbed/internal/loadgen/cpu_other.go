// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !unix

package loadgen

import "time"

// processCPU is not measured on this platform.
func processCPU() time.Duration { return 0 }
