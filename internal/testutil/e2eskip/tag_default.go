// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build !e2e

package e2eskip // import "github.com/otelthrottle/throttle/internal/testutil/e2eskip"

// tagged: this build has the e2e tag (make e2e).
const tagged = false
