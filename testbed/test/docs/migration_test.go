// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/processor/memorylimiterprocessor"
	yaml "go.yaml.in/yaml/v3"

	"github.com/otelthrottle/throttle/extension/throttleextension"
)

// The migration guide's examples load into the configurations of both
// components through their factories, and every row of its field mapping
// that names a throttle field holds in the examples: the throttle field
// has the memory_limiter field's value, or the value its formula gives. A
// wrong field, a wrong formula or an example that drifted from the table
// fails here.
func TestMigrationGuideMapping(t *testing.T) {
	md := repoFile(t, "docs/migration.md")
	before := taggedBlocks(t, md, "before")
	after := taggedBlocks(t, md, "after")
	require.NotEmpty(t, before, "no <!-- before: ... --> yaml blocks in docs/migration.md")
	require.ElementsMatch(t, keys(before), keys(after), "every example needs a before and an after")

	type example struct {
		name    string
		limiter *memorylimiterprocessor.Config
		set     *confmap.Conf // the memory_limiter section as written
		thr     *throttleextension.Config
	}
	var examples []example
	for _, name := range keys(before) {
		set, limiter := loadMemoryLimiter(t, name, before[name])
		examples = append(examples, example{name: name, limiter: limiter, set: set, thr: loadThrottle(t, name, after[name])})
	}

	rows := tableRows(t, md, "## Field mapping")
	covered := map[string]bool{}
	for _, row := range rows {
		require.Len(t, row, 3, "row %v: want memory_limiter field, throttle field, value", row)
		mlKey, ok := codeSpan(row[0])
		require.True(t, ok, "row %v: the memory_limiter field must be one code span", row)
		_, ok = fieldByTag(reflect.ValueOf(memorylimiterprocessor.NewFactory().CreateDefaultConfig()), mlKey)
		require.True(t, ok, "row %v: memory_limiter has no field %q", row, mlKey)
		covered[mlKey] = true

		if row[1] == "no equivalent" {
			continue
		}
		thrPath, ok := codeSpan(row[1])
		require.True(t, ok, "row %v: the throttle field must be one code span or \"no equivalent\"", row)
		_, ok = fieldByTag(reflect.ValueOf(throttleextension.NewFactory().CreateDefaultConfig()), thrPath)
		require.True(t, ok, "row %v: throttle has no field %q", row, thrPath)

		formula := mlKey
		if row[2] != "same value" {
			formula, ok = codeSpan(row[2])
			require.True(t, ok, "row %v: the value must be \"same value\" or a formula in one code span", row)
		}
		expr, err := parseFormula(formula)
		require.NoError(t, err, "row %v", row)

		checked := 0
		for _, ex := range examples {
			// A row applies to an example that sets its field and every
			// field its formula reads.
			if !ex.set.IsSet(mlKey) || slices.ContainsFunc(expr.fields(), func(f string) bool { return !ex.set.IsSet(f) }) {
				continue
			}
			checked++
			got, _ := fieldByTag(reflect.ValueOf(ex.thr), thrPath)
			if row[2] == "same value" {
				want, _ := fieldByTag(reflect.ValueOf(ex.limiter), mlKey)
				assert.Truef(t, sameValue(want, got), "example %q, row %v: throttle %s = %v, memory_limiter %s = %v", ex.name, row, thrPath, got, mlKey, want)
				continue
			}
			want, err := expr.eval(func(f string) (float64, error) {
				v, ok := fieldByTag(reflect.ValueOf(ex.limiter), f)
				if !ok {
					return 0, fmt.Errorf("memory_limiter has no field %q", f)
				}
				n, ok := number(v)
				if !ok {
					return 0, fmt.Errorf("memory_limiter's %q is not a number", f)
				}
				return n, nil
			})
			require.NoError(t, err, "row %v", row)
			n, ok := number(got)
			require.True(t, ok, "row %v: throttle's %s is not a number", row, thrPath)
			assert.InDeltaf(t, want, n, 1e-9, "example %q, row %v: throttle %s = %v, the formula gives %v", ex.name, row, thrPath, n, want)
		}
		assert.Positivef(t, checked, "row %v: no example sets %s and what its value reads; add one to docs/migration.md", row, mlKey)
	}

	for _, k := range topLevelTags(reflect.TypeFor[memorylimiterprocessor.Config]()) {
		assert.Truef(t, covered[k], "memory_limiter's %q has no row in the field mapping of docs/migration.md", k)
	}
}

// loadMemoryLimiter unmarshals the memory_limiter section of a collector
// configuration (processor or extension: both take this configuration)
// into the processor factory's config, and validates it.
func loadMemoryLimiter(t *testing.T, name, doc string) (*confmap.Conf, *memorylimiterprocessor.Config) {
	t.Helper()
	all := confFromYAML(t, doc)
	var sections []*confmap.Conf
	for _, kind := range []string{"processors", "extensions"} {
		if all.IsSet(kind + "::memory_limiter") {
			sub, err := all.Sub(kind + "::memory_limiter")
			require.NoError(t, err)
			sections = append(sections, sub)
		}
	}
	require.Len(t, sections, 1, "example %q before: want one memory_limiter section, under processors or extensions", name)
	cfg := memorylimiterprocessor.NewFactory().CreateDefaultConfig()
	require.NoError(t, sections[0].Unmarshal(cfg), "example %q before", name)
	require.NoError(t, confmap.Validate(cfg), "example %q before", name)
	return sections[0], cfg.(*memorylimiterprocessor.Config)
}

// loadThrottle unmarshals extensions::throttle of a collector
// configuration into the throttle extension factory's config, and
// validates it.
func loadThrottle(t *testing.T, name, doc string) *throttleextension.Config {
	t.Helper()
	all := confFromYAML(t, doc)
	require.True(t, all.IsSet("extensions::throttle"), "example %q after: no extensions::throttle", name)
	sub, err := all.Sub("extensions::throttle")
	require.NoError(t, err)
	cfg := throttleextension.NewFactory().CreateDefaultConfig()
	require.NoError(t, sub.Unmarshal(cfg), "example %q after", name)
	require.NoError(t, confmap.Validate(cfg), "example %q after", name)
	return cfg.(*throttleextension.Config)
}

func confFromYAML(t *testing.T, doc string) *confmap.Conf {
	t.Helper()
	var raw map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(doc), &raw))
	return confmap.NewFromStringMap(raw)
}

// fieldByTag follows a path of mapstructure names ("memory::limit_mib" or
// "memory.limit_mib") from v through pointers and structs.
func fieldByTag(v reflect.Value, path string) (reflect.Value, bool) {
	for name := range strings.SplitSeq(strings.ReplaceAll(path, "::", "."), ".") {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}
		f, ok := fieldNamed(v, name)
		if !ok {
			return reflect.Value{}, false
		}
		v = f
	}
	return v, true
}

// fieldNamed is the field of struct v whose key is name, looking into
// squashed structs as the decoder does.
func fieldNamed(v reflect.Value, name string) (reflect.Value, bool) {
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if squashed(f) {
			if fv, ok := fieldNamed(v.Field(i), name); ok {
				return fv, true
			}
			continue
		}
		if tagName(f) == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func tagName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
	return name
}

func squashed(f reflect.StructField) bool {
	_, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
	return opts == "squash"
}

func topLevelTags(typ reflect.Type) []string {
	var tags []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		if squashed(f) {
			tags = append(tags, topLevelTags(f.Type)...)
		} else if name := tagName(f); name != "" && name != "-" {
			tags = append(tags, name)
		}
	}
	return tags
}

// number returns a numeric field as a float64; durations are not numbers.
func number(v reflect.Value) (float64, bool) {
	if v.Type() == reflect.TypeFor[time.Duration]() {
		return 0, false
	}
	switch {
	case v.CanInt():
		return float64(v.Int()), true
	case v.CanUint():
		return float64(v.Uint()), true
	case v.CanFloat():
		return v.Float(), true
	}
	return 0, false
}

// sameValue compares two fields of the two configurations: durations with
// durations, numbers with numbers whatever their Go types.
func sameValue(a, b reflect.Value) bool {
	dur := reflect.TypeFor[time.Duration]()
	if a.Type() == dur || b.Type() == dur {
		return a.Type() == b.Type() && a.Int() == b.Int()
	}
	x, okA := number(a)
	y, okB := number(b)
	return okA && okB && x == y
}

func keys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// formula is the value column of the field mapping: arithmetic on
// memory_limiter field names and numbers, with + − × / and parentheses.
type formula struct {
	op          byte // 0 for a leaf
	left, right *formula
	num         float64
	field       string
}

func (f *formula) fields() []string {
	switch {
	case f.op != 0:
		return append(f.left.fields(), f.right.fields()...)
	case f.field != "":
		return []string{f.field}
	}
	return nil
}

func (f *formula) eval(lookup func(string) (float64, error)) (float64, error) {
	if f.op == 0 {
		if f.field != "" {
			return lookup(f.field)
		}
		return f.num, nil
	}
	l, err := f.left.eval(lookup)
	if err != nil {
		return 0, err
	}
	r, err := f.right.eval(lookup)
	if err != nil {
		return 0, err
	}
	switch f.op {
	case '+':
		return l + r, nil
	case '-':
		return l - r, nil
	case '*':
		return l * r, nil
	default:
		if r == 0 {
			return math.NaN(), nil
		}
		return l / r, nil
	}
}

// parseFormula parses expr := term {(+|-) term}; term := factor {(*|/)
// factor}; factor := number | field | ( expr ). − and × are read as - and *.
func parseFormula(s string) (*formula, error) {
	p := &formulaParser{src: []rune(strings.NewReplacer("−", "-", "×", "*").Replace(s))}
	f, err := p.expr()
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.src) {
		return nil, fmt.Errorf("formula %q: unexpected %q", s, string(p.src[p.pos:]))
	}
	return f, nil
}

type formulaParser struct {
	src []rune
	pos int
}

func (p *formulaParser) skipSpace() {
	for p.pos < len(p.src) && unicode.IsSpace(p.src[p.pos]) {
		p.pos++
	}
}

func (p *formulaParser) peek() rune {
	p.skipSpace()
	if p.pos == len(p.src) {
		return 0
	}
	return p.src[p.pos]
}

func (p *formulaParser) expr() (*formula, error) {
	return p.binary("+-", p.term)
}

func (p *formulaParser) term() (*formula, error) {
	return p.binary("*/", p.factor)
}

func (p *formulaParser) binary(ops string, operand func() (*formula, error)) (*formula, error) {
	left, err := operand()
	if err != nil {
		return nil, err
	}
	for c := p.peek(); c != 0 && strings.ContainsRune(ops, c); c = p.peek() {
		p.pos++
		right, err := operand()
		if err != nil {
			return nil, err
		}
		left = &formula{op: byte(c), left: left, right: right}
	}
	return left, nil
}

func (p *formulaParser) factor() (*formula, error) {
	c := p.peek()
	switch {
	case c == '(':
		p.pos++
		f, err := p.expr()
		if err != nil {
			return nil, err
		}
		if p.peek() != ')' {
			return nil, fmt.Errorf("missing ) at %d", p.pos)
		}
		p.pos++
		return f, nil
	case unicode.IsDigit(c) || c == '.':
		start := p.pos
		for p.pos < len(p.src) && (unicode.IsDigit(p.src[p.pos]) || p.src[p.pos] == '.') {
			p.pos++
		}
		n, err := strconv.ParseFloat(string(p.src[start:p.pos]), 64)
		if err != nil {
			return nil, err
		}
		return &formula{num: n}, nil
	case unicode.IsLetter(c) || c == '_':
		start := p.pos
		for p.pos < len(p.src) && (unicode.IsLetter(p.src[p.pos]) || unicode.IsDigit(p.src[p.pos]) || p.src[p.pos] == '_') {
			p.pos++
		}
		return &formula{field: string(p.src[start:p.pos])}, nil
	}
	return nil, fmt.Errorf("unexpected %q at %d", string(c), p.pos)
}

func TestParseFormula(t *testing.T) {
	lookup := func(vals map[string]float64) func(string) (float64, error) {
		return func(f string) (float64, error) {
			v, ok := vals[f]
			if !ok {
				return 0, fmt.Errorf("no %q", f)
			}
			return v, nil
		}
	}
	for src, want := range map[string]float64{
		"(limit_mib − spike_limit_mib) / limit_mib":         0.8,
		"(limit_percentage - spike_limit_percentage) / 100": 0.7,
		"1 - spike_limit_mib / limit_mib":                   0.8,
		"2 × limit_percentage":                              180,
		"limit_mib":                                         4000,
	} {
		f, err := parseFormula(src)
		require.NoError(t, err, src)
		got, err := f.eval(lookup(map[string]float64{"limit_mib": 4000, "spike_limit_mib": 800, "limit_percentage": 90, "spike_limit_percentage": 20}))
		require.NoError(t, err, src)
		assert.InDelta(t, want, got, 1e-12, src)
	}
	for _, bad := range []string{"(limit_mib", "limit_mib -", "limit_mib ? 2", ""} {
		_, err := parseFormula(bad)
		assert.Error(t, err, bad)
	}
}
