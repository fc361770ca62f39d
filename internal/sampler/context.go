// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package sampler // import "github.com/otelthrottle/throttle/internal/sampler"

import "context"

type sourceKey struct{}

// ContextWithSource returns ctx carrying src. A throttle extension created
// with such a context reads its resources from src instead of the
// container's cgroup, and leaves the soft memory limit and the GC percent
// alone (they are this process's): this is how tests outside the
// extension's package (the testbed's) drive the water level of a real
// extension, through its real sampler and state machines, without an API
// of the extension's own.
func ContextWithSource(ctx context.Context, src Source) context.Context {
	return context.WithValue(ctx, sourceKey{}, src)
}

// SourceFromContext is the source ContextWithSource put in ctx, or nil.
func SourceFromContext(ctx context.Context) Source {
	src, _ := ctx.Value(sourceKey{}).(Source)
	return src
}
