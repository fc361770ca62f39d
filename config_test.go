// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/otelthrottle/throttle/internal/metadata"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     *Config
		wantErr error
		wantMsg string
	}{
		{
			name: "default",
			cfg:  createDefaultConfig().(*Config),
		},
		{
			name: "drop",
			cfg:  &Config{Extension: component.MustNewIDWithName("throttle", "edge"), OnReject: OnRejectDrop},
		},
		{
			name:    "unknown on_reject",
			cfg:     &Config{Extension: defaultExtensionID, OnReject: "block"},
			wantErr: errInvalidOnReject,
			wantMsg: `on_reject must be "refuse" or "drop", got "block"`,
		},
		{
			name:    "empty on_reject",
			cfg:     &Config{Extension: defaultExtensionID},
			wantErr: errInvalidOnReject,
			wantMsg: `on_reject must be "refuse" or "drop", got ""`,
		},
		{
			name:    "no extension",
			cfg:     &Config{OnReject: OnRejectRefuse},
			wantErr: errNoExtension,
			wantMsg: "extension must be set to the ID of a throttle extension",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == nil {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.wantErr)
			assert.Equal(t, tt.wantMsg, err.Error())
		})
	}
}

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	require.NoError(t, err)

	tests := []struct {
		id           component.ID
		expected     *Config
		unmarshalErr string
		validateErr  string
	}{
		{
			id:       component.NewID(metadata.Type),
			expected: &Config{Extension: component.MustNewID("throttle"), OnReject: OnRejectRefuse},
		},
		{
			id:       component.NewIDWithName(metadata.Type, "drop"),
			expected: &Config{Extension: component.MustNewID("throttle"), OnReject: OnRejectDrop},
		},
		{
			id:       component.NewIDWithName(metadata.Type, "other_extension"),
			expected: &Config{Extension: component.MustNewIDWithName("throttle", "edge"), OnReject: OnRejectRefuse},
		},
		{
			id:          component.NewIDWithName(metadata.Type, "bad_on_reject"),
			validateErr: `on_reject must be "refuse" or "drop", got "block"`,
		},
		{
			// Values are case-sensitive, like the collector's other enums.
			id:          component.NewIDWithName(metadata.Type, "uppercase_on_reject"),
			validateErr: `on_reject must be "refuse" or "drop", got "DROP"`,
		},
		{
			id:           component.NewIDWithName(metadata.Type, "empty_extension"),
			unmarshalErr: "id must not be empty",
		},
		{
			id:           component.NewIDWithName(metadata.Type, "bad_extension"),
			unmarshalErr: "should not be empty",
		},
	}
	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			cfg := NewFactory().CreateDefaultConfig()
			sub, err := cm.Sub(tt.id.String())
			require.NoError(t, err)
			err = sub.Unmarshal(cfg)
			if tt.unmarshalErr != "" {
				require.ErrorContains(t, err, "extension")
				require.ErrorContains(t, err, tt.unmarshalErr)
				return
			}
			require.NoError(t, err)
			if tt.validateErr != "" {
				require.EqualError(t, confmap.Validate(cfg), tt.validateErr)
				return
			}
			require.NoError(t, confmap.Validate(cfg))
			assert.Equal(t, tt.expected, cfg)
		})
	}
}
