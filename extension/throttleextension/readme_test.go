// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"
)

// The README's example configuration loads and validates: a field it names
// that does not exist, or a value out of range, fails here.
func TestReadmeExampleLoads(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)### Example\n.*?```yaml\n(.*?)```").FindSubmatch(readme)
	require.NotNil(t, m, "no yaml block under ### Example in README.md")
	example := filepath.Join(t.TempDir(), "example.yaml")
	require.NoError(t, os.WriteFile(example, m[1], 0o600))
	all, err := confmaptest.LoadConf(example)
	require.NoError(t, err)
	conf, err := all.Sub("extensions::throttle")
	require.NoError(t, err)
	require.NotEmpty(t, conf.AllKeys())
	cfg := createDefaultConfig().(*Config)
	require.NoError(t, conf.Unmarshal(cfg))
	require.NoError(t, confmap.Validate(cfg))
}
