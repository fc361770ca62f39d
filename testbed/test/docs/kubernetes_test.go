// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
	yaml "go.yaml.in/yaml/v3"

	"github.com/otelthrottle/throttle/extension/throttleextension"
)

// manifest is one YAML document of examples/kubernetes, as a tree.
type manifest struct {
	file string
	doc  map[string]any
}

func (m manifest) kind() string { return str(m.doc, "kind") }
func (m manifest) name() string { return str(m.doc, "metadata", "name") }

// The Kubernetes manifests parse, are the kinds docs/kubernetes.md
// describes, scale on the demand metric the extension exports under the
// name its metadata.yaml gives, with one target, and fit the collector
// configuration and the extension's defaults they are written against.
// kubectl is not available: this is what a YAML check can assert.
func TestKubernetesManifests(t *testing.T) {
	demand := demandMetricName(t)
	byKind := map[string][]manifest{}
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "examples", "kubernetes", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		for _, m := range parseManifests(t, f) {
			if m.kind() == "" { // the Helm values: not a manifest
				require.Equal(t, "helm-values.yaml", filepath.Base(f), "%s: a document without kind", f)
				continue
			}
			require.NotEmpty(t, str(m.doc, "apiVersion"), "%s: %s without apiVersion", m.file, m.kind())
			require.NotEmpty(t, m.name(), "%s: %s without metadata.name", m.file, m.kind())
			byKind[m.kind()] = append(byKind[m.kind()], m)
		}
	}
	count := map[string]int{}
	for k, ms := range byKind {
		count[k] = len(ms)
	}
	assert.Equal(t, map[string]int{
		"Deployment": 1, "Service": 1, "PodMonitor": 1, "ConfigMap": 1,
		"HorizontalPodAutoscaler": 2, "ScaledObject": 1,
	}, count)

	dep := only(t, byKind, "Deployment")
	labels := mapAt(t, dep.doc, "spec", "template", "metadata", "labels")
	assert.Equal(t, labels, mapAt(t, dep.doc, "spec", "selector", "matchLabels"))
	container := listAt(t, dep.doc, "spec", "template", "spec", "containers")[0].(map[string]any)
	checkContainer(t, container)
	assert.Equal(t, labels, mapAt(t, only(t, byKind, "PodMonitor").doc, "spec", "selector", "matchLabels"), "the PodMonitor selects the Deployment's pods")
	assert.Equal(t, labels, mapAt(t, only(t, byKind, "Service").doc, "spec", "selector"))

	var targets []float64
	for _, hpa := range byKind["HorizontalPodAutoscaler"] {
		ref := mapAt(t, hpa.doc, "spec", "scaleTargetRef")
		assert.Equal(t, "Deployment", ref["kind"], hpa.file)
		assert.Equal(t, dep.name(), ref["name"], hpa.file)
		metrics := listAt(t, hpa.doc, "spec", "metrics")
		require.Len(t, metrics, 1, hpa.file)
		metric := metrics[0].(map[string]any)
		switch metric["type"] {
		case "Resource": // on CPU: below the CPU enter line, or it fires late or never
			assert.Equal(t, "cpu", str(metric, "resource", "name"), hpa.file)
			util, ok := mapAt(t, metric, "resource", "target")["averageUtilization"].(int)
			require.True(t, ok, "%s: averageUtilization", hpa.file)
			enter := throttleextension.NewFactory().CreateDefaultConfig().(*throttleextension.Config).CPU.Enter
			assert.Less(t, float64(util), enter*100, "%s: a CPU target at or above cpu.enter", hpa.file)
		case "Pods": // on demand, through the Prometheus adapter
			assert.Equal(t, demand, str(metric, "pods", "metric", "name"), hpa.file)
			target := mapAt(t, metric, "pods", "target")
			assert.Equal(t, "AverageValue", target["type"], hpa.file)
			targets = append(targets, quantity(t, str(target, "averageValue")))
		default:
			t.Errorf("%s: metric type %v", hpa.file, metric["type"])
		}
	}

	adapter := only(t, byKind, "ConfigMap")
	var rules struct {
		Rules []struct {
			SeriesQuery  string `yaml:"seriesQuery"`
			MetricsQuery string `yaml:"metricsQuery"`
			Name         struct {
				As string `yaml:"as"`
			} `yaml:"name"`
			Resources struct {
				Overrides map[string]map[string]string `yaml:"overrides"`
			} `yaml:"resources"`
		} `yaml:"rules"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(str(adapter.doc, "data", "config.yaml")), &rules), adapter.file)
	require.Len(t, rules.Rules, 1, adapter.file)
	rule := rules.Rules[0]
	assert.True(t, strings.HasPrefix(rule.SeriesQuery, demand+"{"), "%s: seriesQuery %q", adapter.file, rule.SeriesQuery)
	assert.Equal(t, demand, rule.Name.As, adapter.file)
	assert.Equal(t, "pod", rule.Resources.Overrides["pod"]["resource"], adapter.file)
	assert.Contains(t, rule.MetricsQuery, "<<.Series>>", adapter.file)

	scaled := only(t, byKind, "ScaledObject")
	assert.Equal(t, dep.name(), str(scaled.doc, "spec", "scaleTargetRef", "name"))
	triggers := listAt(t, scaled.doc, "spec", "triggers")
	require.Len(t, triggers, 1)
	trigger := triggers[0].(map[string]any)
	assert.Equal(t, "prometheus", trigger["type"])
	query := str(trigger, "metadata", "query")
	assert.True(t, strings.HasPrefix(query, "sum("+demand+"{"), "KEDA's query %q: the pods' sum of %s (KEDA divides by the threshold)", query, demand)
	threshold, err := strconv.ParseFloat(str(trigger, "metadata", "threshold"), 64)
	require.NoError(t, err)
	targets = append(targets, threshold)

	require.Len(t, targets, 2)
	assert.InDelta(t, targets[0], targets[1], 1e-9, "the adapter's HPA and KEDA scale on demand with one target")
	assert.Less(t, targets[0], 1.0, "a demand target of 1 or more scales out only once the collector refuses")
}

// checkContainer: requests equal limits (the HPA's CPU utilisation is then
// throttle's CPU level), no GOMEMLIMIT (the throttle sets and follows the
// soft limit), and the ports and probes are those of the collector
// configuration the Deployment mounts.
func checkContainer(t *testing.T, c map[string]any) {
	t.Helper()
	res := mapAt(t, c, "resources")
	assert.Equal(t, res["limits"], res["requests"], "requests = limits")
	for _, k := range []string{"cpu", "memory"} {
		assert.NotNil(t, mapAt(t, res, "limits")[k], "a %s limit: throttle's lines are shares of it", k)
	}
	if env, ok := c["env"].([]any); ok {
		for _, e := range env {
			assert.NotEqual(t, "GOMEMLIMIT", str(e.(map[string]any), "name"))
		}
	}
	ports := map[string]int{}
	for _, p := range listAt(t, c, "ports") {
		ports[str(p.(map[string]any), "name")] = p.(map[string]any)["containerPort"].(int)
	}
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		assert.Equal(t, "health", str(c, probe, "httpGet", "port"), probe)
	}

	cfgDoc := repoFile(t, "examples/kubernetes-config.yaml")
	var raw map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(cfgDoc), &raw))
	all := confmap.NewFromStringMap(raw)
	endpointPort := func(key string) int {
		ep, ok := all.Get(key).(string)
		require.True(t, ok, "examples/kubernetes-config.yaml: %s", key)
		_, p, _ := strings.Cut(ep, ":")
		n, err := strconv.Atoi(p)
		require.NoError(t, err, key)
		return n
	}
	assert.Equal(t, endpointPort("extensions::health_check::endpoint"), ports["health"])
	assert.Equal(t, endpointPort("receivers::otlp::protocols::grpc::endpoint"), ports["otlp-grpc"])
	assert.Equal(t, endpointPort("receivers::otlp::protocols::http::endpoint"), ports["otlp-http"])
	readers, ok := all.Get("service::telemetry::metrics::readers").([]any)
	require.True(t, ok)
	prom := readers[0].(map[string]any)["pull"].(map[string]any)["exporter"].(map[string]any)["prometheus"].(map[string]any)
	assert.Equal(t, prom["port"], ports["metrics"], "the metrics port is the collector's Prometheus reader's")
	assert.Equal(t, "0.0.0.0", prom["host"])

	// The throttle section of the mounted configuration loads and validates.
	sub, err := all.Sub("extensions::throttle")
	require.NoError(t, err)
	cfg := throttleextension.NewFactory().CreateDefaultConfig()
	require.NoError(t, sub.Unmarshal(cfg))
	require.NoError(t, confmap.Validate(cfg))
	assert.Contains(t, all.Get("service::extensions"), "throttle")
}

// The Helm values load the throttle, put it on both OTLP servers, turn
// useGOMEMLIMIT off and take the chart's memory_limiter out of every
// pipeline, as docs/kubernetes.md says.
func TestHelmValues(t *testing.T) {
	ms := parseManifests(t, filepath.Join("..", "..", "..", "examples", "kubernetes", "helm-values.yaml"))
	require.Len(t, ms, 1)
	v := ms[0].doc
	useGOMEMLIMIT, ok := v["useGOMEMLIMIT"].(bool)
	require.True(t, ok, "useGOMEMLIMIT")
	assert.False(t, useGOMEMLIMIT)
	assert.Equal(t, at(v, "resources", "limits"), at(v, "resources", "requests"))
	processors := mapAt(t, v, "config", "processors")
	ml, ok := processors["memory_limiter"]
	assert.True(t, ok && ml == nil, "memory_limiter: null removes the chart's")
	for _, proto := range []string{"grpc", "http"} {
		assert.Equal(t, []any{map[string]any{"id": "throttle"}}, at(v, "config", "receivers", "otlp", "protocols", proto, "middlewares"), proto)
	}
	exts := listAt(t, v, "config", "service", "extensions")
	assert.Contains(t, exts, "throttle")
	assert.Contains(t, exts, "health_check", "the chart's probes need health_check")
	for _, p := range []string{"traces", "metrics", "logs"} {
		assert.NotContains(t, listAt(t, v, "config", "service", "pipelines", p, "processors"), "memory_limiter", p)
	}
	cfg := throttleextension.NewFactory().CreateDefaultConfig()
	require.NoError(t, confmap.NewFromStringMap(mapAt(t, v, "config", "extensions", "throttle")).Unmarshal(cfg))
	require.NoError(t, confmap.Validate(cfg))
}

// quantity parses a Kubernetes quantity of the forms the manifests use:
// a plain number or thousandths ("800m").
func quantity(t *testing.T, s string) float64 {
	t.Helper()
	scale := 1.0
	if m, ok := strings.CutSuffix(s, "m"); ok {
		s, scale = m, 1e-3
	}
	n, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err, "quantity %q", s)
	return n * scale
}

// demandMetricName is the demand gauge's name as the collector exports it:
// otelcol_ and its key in the extension's metadata.yaml.
func demandMetricName(t *testing.T) string {
	t.Helper()
	var md struct {
		Telemetry struct {
			Metrics map[string]any `yaml:"metrics"`
		} `yaml:"telemetry"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(repoFile(t, "extension/throttleextension/metadata.yaml")), &md))
	const key = "throttle_demand"
	require.Contains(t, md.Telemetry.Metrics, key, "extension/throttleextension/metadata.yaml has no %s", key)
	return "otelcol_" + key
}

func parseManifests(t *testing.T, path string) []manifest {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []manifest
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, path)
		if doc != nil {
			out = append(out, manifest{file: filepath.Base(path), doc: doc})
		}
	}
	require.NotEmpty(t, out, path)
	return out
}

func only(t *testing.T, byKind map[string][]manifest, kind string) manifest {
	t.Helper()
	require.Len(t, byKind[kind], 1, kind)
	return byKind[kind][0]
}

func at(m map[string]any, path ...string) any {
	var v any = m
	for _, k := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func str(m map[string]any, path ...string) string {
	s, _ := at(m, path...).(string)
	return s
}

func mapAt(t *testing.T, m map[string]any, path ...string) map[string]any {
	t.Helper()
	v, ok := at(m, path...).(map[string]any)
	require.True(t, ok, "no map at %s", strings.Join(path, "."))
	return v
}

func listAt(t *testing.T, m map[string]any, path ...string) []any {
	t.Helper()
	v, ok := at(m, path...).([]any)
	require.True(t, ok && len(v) > 0, "no list at %s", strings.Join(path, "."))
	return v
}
