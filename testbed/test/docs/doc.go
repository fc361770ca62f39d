// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package docs checks the examples of the repository's documentation
// against the components they describe: the migration guide's
// configurations and field mapping (docs/migration.md) and the Kubernetes
// manifests (examples/kubernetes, docs/kubernetes.md).
package docs
