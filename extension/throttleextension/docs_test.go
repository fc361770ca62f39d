// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
	yaml "go.yaml.in/yaml/v3"
)

// The defaults the documentation quotes are the ones createDefaultConfig
// gives. A quote is found in one of three forms, so that a default changed
// in code or in the docs fails here:
//
//   - a markdown table whose first column is "field" or "setting" and that
//     has a "default" column: each field's code span (`cpu.enter`, and
//     `.exit` for a sibling) against the default's (`0.90` / `0.80`);
//   - in prose, a field's code span followed by "(default `value`)":
//     "`check_interval` (default `250ms`)";
//   - in YAML (examples/*.yaml and the markdown files' yaml blocks), a key
//     of the throttle extension's configuration whose line comment starts
//     with "default" ("# defaults"): every value under it, except where a
//     line's comment says "not a default".
//
// A quote is checked by writing it into the default configuration, as the
// collector decodes it: the field must exist and keep its value.

// docFiles are the documents whose quoted defaults are checked.
var docFiles = []string{
	"README.md",
	"../../README.md",
	"../../docs/migration.md",
}

// quote is one default quoted by a document: the field's path and the
// value as written (decoded as YAML).
type quote struct {
	where string
	path  []string
	value any
}

func TestDocumentedDefaults(t *testing.T) {
	var quotes []quote
	for _, f := range docFiles {
		md, err := os.ReadFile(f)
		require.NoError(t, err)
		quotes = append(quotes, tableQuotes(t, f, string(md))...)
		quotes = append(quotes, proseQuotes(t, f, string(md))...)
		for i, block := range yamlBlocks(string(md)) {
			quotes = append(quotes, yamlQuotes(t, fmt.Sprintf("%s, yaml block %d", f, i+1), block)...)
		}
	}
	examples, err := filepath.Glob("../../examples/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, examples)
	for _, f := range examples {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		quotes = append(quotes, yamlQuotes(t, f, string(b))...)
	}
	// Every form is in use: a parser that stopped finding them would let
	// every quote drift.
	perForm := map[string]int{}
	for _, q := range quotes {
		perForm[strings.SplitN(q.where, ":", 2)[0]]++
	}
	for form, least := range map[string]int{"table": 35, "prose": 10, "yaml": 40} {
		require.GreaterOrEqual(t, perForm[form], least, "%s quotes found, of %v", form, perForm)
	}

	def := reflect.ValueOf(createDefaultConfig())
	for _, q := range quotes {
		cfg := createDefaultConfig()
		conf := map[string]any{}
		nested := conf
		for _, k := range q.path[:len(q.path)-1] {
			m := map[string]any{}
			nested[k] = m
			nested = m
		}
		nested[q.path[len(q.path)-1]] = q.value
		field := strings.Join(q.path, ".")
		if err := confmap.NewFromStringMap(conf).Unmarshal(cfg); err != nil {
			t.Errorf("%s: %s: %v", q.where, field, err)
			continue
		}
		got, ok := fieldAt(reflect.ValueOf(cfg), q.path)
		require.True(t, ok, "%s: %s is no field", q.where, field)
		want, _ := fieldAt(def, q.path)
		assert.Equal(t, want.Interface(), got.Interface(), "%s quotes %v as the default of %s", q.where, q.value, field)
	}
}

var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	// proseDefault is "`field` (default `value`)".
	proseDefault = regexp.MustCompile("`([a-z_]+(?:\\.[a-z_]+)*)` \\(default `([^`]+)`\\)")
	yamlBlock    = regexp.MustCompile("(?s)```yaml\n(.*?)```")
)

// tableQuotes are the defaults quoted by md's tables with a "field" (or
// "setting") and a "default" column.
func tableQuotes(t *testing.T, where, md string) []quote {
	var out []quote
	defaultCol := -1
	for i, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			defaultCol = -1
			continue
		}
		cells := tableCells(line)
		if defaultCol < 0 {
			if first := strings.ToLower(cells[0]); first == "field" || first == "setting" {
				for c, h := range cells {
					if strings.EqualFold(h, "default") {
						defaultCol = c
					}
				}
			}
			continue
		}
		if defaultCol >= len(cells) || strings.HasPrefix(cells[0], "---") {
			continue
		}
		fields := spans(cells[0])
		values := spans(cells[defaultCol])
		if len(fields) == 0 || len(values) == 0 || strings.Contains(fields[0], "<") {
			continue // no value quoted ("absent: off"), or no single field
		}
		require.Len(t, values, len(fields), "%s:%d: %d fields and %d defaults", where, i+1, len(fields), len(values))
		path := strings.Split(fields[0], ".")
		for j, f := range fields {
			if strings.HasPrefix(f, ".") { // `.exit`: a sibling of the first
				path = append(path[:len(path)-1:len(path)-1], f[1:])
			}
			out = append(out, quote{where: fmt.Sprintf("table: %s:%d", where, i+1), path: path, value: yamlValue(t, values[j])})
		}
	}
	return out
}

// tableCells splits a table row at the bars that are not escaped.
func tableCells(line string) []string {
	var cells []string
	var cell strings.Builder
	for i := 1; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cell.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(line[i])
		}
	}
	return cells
}

func spans(s string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// proseQuotes are md's "`field` (default `value`)", outside code blocks.
func proseQuotes(t *testing.T, where, md string) []quote {
	var out []quote
	text := yamlBlock.ReplaceAllString(md, "")
	for _, m := range proseDefault.FindAllStringSubmatchIndex(text, -1) {
		out = append(out, quote{
			where: fmt.Sprintf("prose: %s: %q", where, text[m[0]:m[1]]),
			path:  strings.Split(text[m[2]:m[3]], "."),
			value: yamlValue(t, text[m[4]:m[5]]),
		})
	}
	return out
}

func yamlBlocks(md string) []string {
	var out []string
	for _, m := range yamlBlock.FindAllStringSubmatch(md, -1) {
		out = append(out, m[1])
	}
	return out
}

func yamlValue(t *testing.T, s string) any {
	var v any
	require.NoError(t, yaml.Unmarshal([]byte(s), &v), "%q", s)
	return v
}

// yamlQuotes are the defaults quoted by a YAML document: the values under a
// key of a throttle extension's configuration whose comment starts with
// "default".
func yamlQuotes(t *testing.T, where, doc string) []quote {
	var root yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte(doc), &root), where)
	if len(root.Content) == 0 {
		return nil
	}
	exts := mappingValue(root.Content[0], "extensions")
	if exts == nil {
		return nil
	}
	var out []quote
	for i := 0; i+1 < len(exts.Content); i += 2 {
		if name := exts.Content[i].Value; name == "throttle" || strings.HasPrefix(name, "throttle/") {
			walkQuotes(t, where, exts.Content[i], exts.Content[i+1], nil, false, &out)
		}
	}
	return out
}

// walkQuotes collects the scalars under value (the node of key, at path),
// quoted as defaults when marked is or the key's comment starts with
// "default", unless a comment says "not a default".
func walkQuotes(t *testing.T, where string, key, value *yaml.Node, path []string, marked bool, out *[]quote) {
	comment := strings.ToLower(strings.TrimSpace(strings.TrimPrefix(key.LineComment+value.LineComment, "#")))
	if strings.Contains(comment, "not a default") {
		return
	}
	marked = marked || strings.HasPrefix(comment, "default")
	switch value.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(value.Content); i += 2 {
			walkQuotes(t, where, value.Content[i], value.Content[i+1], append(path[:len(path):len(path)], value.Content[i].Value), marked, out)
		}
	case yaml.ScalarNode:
		if marked && len(path) > 0 {
			var v any
			require.NoError(t, value.Decode(&v))
			*out = append(*out, quote{where: fmt.Sprintf("yaml: %s:%d", where, value.Line), path: path, value: v})
		}
	}
}

func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// fieldAt is the field of cfg at path, keyed as users write it: struct
// fields by their mapstructure tag (looking into squashed structs), map
// entries by key.
func fieldAt(v reflect.Value, path []string) (reflect.Value, bool) {
	for _, k := range path {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			v = v.Elem()
		}
		switch v.Kind() {
		case reflect.Struct:
			f, ok := structField(v, k)
			if !ok {
				return reflect.Value{}, false
			}
			v = f
		case reflect.Map:
			v = v.MapIndex(reflect.ValueOf(k))
			if !v.IsValid() {
				return reflect.Value{}, false
			}
		default:
			return reflect.Value{}, false
		}
	}
	return v, true
}

func structField(v reflect.Value, key string) (reflect.Value, bool) {
	for i := range v.NumField() {
		name, opts, _ := strings.Cut(v.Type().Field(i).Tag.Get("mapstructure"), ",")
		if opts == "squash" {
			if f, ok := structField(v.Field(i), key); ok {
				return f, true
			}
		} else if name == key && v.Type().Field(i).IsExported() {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}
