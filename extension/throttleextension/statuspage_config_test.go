// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
)

// The status page shows the effective configuration as users write it: read
// back as a configuration, it is the one the extension runs with, defaults
// and all.
func TestStatusPageShowsEffectiveConfig(t *testing.T) {
	src := newStatusTestSource()
	f := newFactory(factoryOptions{source: src})
	cfg := f.CreateDefaultConfig().(*Config)
	require.NoError(t, confmap.NewFromStringMap(map[string]any{
		"observe_only": true,
		"status":       map[string]any{"endpoint": "127.0.0.1:0"},
		"rules":        map[string]any{"logs": map[string]any{"drop_max": 0.5}},
	}).Unmarshal(cfg))
	require.NoError(t, confmap.Validate(cfg))
	set := extensiontest.NewNopSettings(metadata.Type)
	core, logs := observer.New(zapcore.InfoLevel)
	set.Logger = zap.New(core)
	ext, err := f.Create(context.Background(), set, cfg)
	require.NoError(t, err)
	e := ext.(*throttleExtension)
	require.NoError(t, e.Start(context.Background(), componenttest.NewNopHost()))
	t.Cleanup(func() { require.NoError(t, e.Shutdown(context.Background())) })

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + statusPageAddr(logs) + "/status")
	require.NoError(t, err)
	defer resp.Body.Close()
	var doc struct {
		ObserveOnly bool           `json:"observe_only"`
		Config      map[string]any `json:"config"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	assert.True(t, doc.ObserveOnly)
	require.NotEmpty(t, doc.Config)

	shown := f.CreateDefaultConfig().(*Config)
	require.NoError(t, confmap.NewFromStringMap(doc.Config).Unmarshal(shown))
	assert.Equal(t, cfg, shown)
}
