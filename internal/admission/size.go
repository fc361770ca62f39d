// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/confmap"
)

var (
	_ confmap.ScalarUnmarshaler = (*ByteSize)(nil)
	_ confmap.ScalarUnmarshaler = (*InflightBudget)(nil)
)

// The bounds of "auto" in InflightBudget.Resolve.
const (
	// autoBudgetDivisor: "auto" never reserves more than memLimit/12
	// (8.3%) for the bytes of admitted, unfinished requests: every admitted
	// byte costs several while it is read and decoded, so the budget can pin
	// close to half the limit in the worst case, which still leaves the
	// pipeline and the Go runtime their share.
	autoBudgetDivisor = 12
	// autoBudgetPerCore: "auto" never reserves more than this per effective
	// core either. The work in progress a CPU-bound collector needs to keep
	// its cores busy grows with its cores, not its memory; beyond it,
	// admitted requests only wait for the CPU while they hold memory and
	// take CPU from the exporters that drain the pipeline (docs/decisions.md,
	// "The admission budget per core", has the measurements behind the figure).
	autoBudgetPerCore = 10 << 20
	// minAutoBudget: a budget is always at least one ordinary OTLP batch
	// (the SDK exporters' default is 1 MiB); a larger request runs alone.
	minAutoBudget = 1 << 20
	// maxAutoBudget: above 256 MiB the budget no longer bounds a burst
	// between two samples in any useful way; the state machines do.
	maxAutoBudget = 256 << 20
	// noLimitAutoBudget caps "auto" when there is no memory limit to take a
	// share of (no cgroup limit, no memory.limit_mib): the budget of
	// a ~384 MiB container.
	noLimitAutoBudget = 32 << 20
)

// MaxByteSize bounds admission sizes: 1 TiB, far above any container's
// memory. Sizes are byte counts in int64 arithmetic: past 2^63 they would
// wrap negative and turn the budget off.
const MaxByteSize = ByteSize(1 << 40)

// ByteSize is a number of bytes. In configuration it is an integer (bytes)
// or a string: a number with an optional unit, decimal (B, KB, MB, GB, TB;
// also k, M, G, T) or binary (KiB, MiB, GiB, TiB; also Ki, Mi, Gi, Ti as in
// Kubernetes), case-insensitive, for example "1MiB", "64MB", "1.5GiB".
// A fraction must come to a whole number of bytes.
type ByteSize uint64

// The binary units.
const (
	KiB ByteSize = 1 << 10
	MiB ByteSize = 1 << 20
	GiB ByteSize = 1 << 30
	TiB ByteSize = 1 << 40
)

var sizeUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "ki": 1 << 10, "kib": 1 << 10,
	"m": 1e6, "mb": 1e6, "mi": 1 << 20, "mib": 1 << 20,
	"g": 1e9, "gb": 1e9, "gi": 1 << 30, "gib": 1 << 30,
	"t": 1e12, "tb": 1e12, "ti": 1 << 40, "tib": 1 << 40,
}

// ParseByteSize parses a size such as "1048576", "1MiB", "64MB" or "1.5GiB".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("invalid size %q: want a number of bytes or a size like 24MiB, 64MB or 1GiB", s)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil || n > math.MaxUint64/mult {
			return 0, fmt.Errorf("invalid size %q: too large", s)
		}
		return ByteSize(n * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: want a number of bytes or a size like 24MiB, 64MB or 1GiB", s)
	}
	v := f * float64(mult)
	if v >= math.MaxUint64 { // 2^64 as a float64
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	return ByteSize(v), nil
}

// String formats b in the largest binary unit that divides it exactly, or in
// bytes ("0", "1MiB", "1536KiB", "1000B"). ParseByteSize reads it back.
func (b ByteSize) String() string {
	n := uint64(b)
	if n == 0 {
		return "0"
	}
	for _, u := range []struct {
		size uint64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n%u.size == 0 {
			return strconv.FormatUint(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// MarshalText implements encoding.TextMarshaler.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *ByteSize) UnmarshalText(text []byte) error {
	v, err := ParseByteSize(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// UnmarshalScalar implements confmap.ScalarUnmarshaler so that a plain YAML
// number is read exactly (a negative or fractional number is an error, not
// truncated) and strings go through UnmarshalText.
func (b *ByteSize) UnmarshalScalar(sv confmap.ScalarValue) error {
	switch raw := sv.GetRaw().(type) {
	case *ByteSize: // already decoded by UnmarshalText
		*b = *raw
		return nil
	case ByteSize:
		*b = raw
		return nil
	}
	n, err := sizeFromScalar(sv.GetRaw())
	if err != nil {
		return err
	}
	*b = n
	return nil
}

// sizeFromScalar reads a size from a decoded YAML scalar.
func sizeFromScalar(raw any) (ByteSize, error) {
	switch v := raw.(type) {
	case string:
		return ParseByteSize(v)
	case int:
		return sizeFromInt(int64(v))
	case int64:
		return sizeFromInt(v)
	case int32:
		return sizeFromInt(int64(v))
	case uint:
		return ByteSize(v), nil
	case uint64:
		return ByteSize(v), nil
	case uint32:
		return ByteSize(v), nil
	case float64:
		if !(v >= 0) || v >= math.MaxUint64 || v != math.Trunc(v) {
			return 0, fmt.Errorf("invalid size %s: want a whole number of bytes >= 0", strconv.FormatFloat(v, 'g', -1, 64))
		}
		return ByteSize(v), nil
	case nil:
		return 0, errors.New("invalid size: empty value")
	default:
		return 0, fmt.Errorf("invalid size %v (%T): want a number of bytes or a size like 24MiB", raw, raw)
	}
}

func sizeFromInt(v int64) (ByteSize, error) {
	if v < 0 {
		return 0, fmt.Errorf("invalid size %d: must be >= 0", v)
	}
	return ByteSize(v), nil
}

// InflightBudget is admission.max_inflight_bytes: "auto", 0 (off) or a
// size. The zero value is off.
type InflightBudget struct {
	auto bool
	size ByteSize
}

// AutoInflightBudget is the "auto" budget, a share of the memory limit
// and of the cores.
func AutoInflightBudget() InflightBudget { return InflightBudget{auto: true} }

// FixedInflightBudget is a budget of n bytes; 0 is off.
func FixedInflightBudget(n ByteSize) InflightBudget { return InflightBudget{size: n} }

// IsAuto reports whether the budget is "auto".
func (b InflightBudget) IsAuto() bool { return b.auto }

// IsOff reports whether the budget is disabled (0).
func (b InflightBudget) IsOff() bool { return !b.auto && b.size == 0 }

// Fixed is the fixed size of the budget; 0 when auto or off.
func (b InflightBudget) Fixed() ByteSize { return b.size }

// Resolve returns the budget in bytes for a memory limit of memLimit
// bytes (0 = no limit) and cores effective cores (<= 0 = unknown), or 0 when
// the budget is off. "auto" is the smaller of memLimit/12 (32 MiB without a
// limit) and 10 MiB per core, within [1 MiB, 256 MiB].
func (b InflightBudget) Resolve(memLimit uint64, cores float64) uint64 {
	if !b.auto {
		return uint64(b.size)
	}
	byMem := uint64(noLimitAutoBudget)
	if memLimit > 0 {
		byMem = memLimit / autoBudgetDivisor
	}
	byCPU := uint64(maxAutoBudget)
	if cores > 0 && !math.IsInf(cores, 0) {
		byCPU = uint64(min(cores*autoBudgetPerCore, maxAutoBudget))
	}
	return min(max(min(byMem, byCPU), minAutoBudget), maxAutoBudget)
}

// HeldPool is the size of the pool that counts what waiting gRPC streams
// may buffer for a memory limit of memLimit bytes: the memory part of the
// "auto" budget (memLimit/12, 32 MiB without a limit, within [1 MiB,
// 256 MiB]), without its per-core bound, which is about CPU work in
// progress: a held stream does no work.
func HeldPool(memLimit uint64) uint64 { return AutoInflightBudget().Resolve(memLimit, 0) }

// String is "auto", "0" or the size.
func (b InflightBudget) String() string {
	if b.auto {
		return "auto"
	}
	return b.size.String()
}

// MarshalText implements encoding.TextMarshaler.
func (b InflightBudget) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: "auto" or a size.
func (b *InflightBudget) UnmarshalText(text []byte) error {
	if strings.EqualFold(strings.TrimSpace(string(text)), "auto") {
		*b = AutoInflightBudget()
		return nil
	}
	n, err := ParseByteSize(string(text))
	if err != nil {
		return fmt.Errorf("%w; or \"auto\", or 0 for off", err)
	}
	*b = FixedInflightBudget(n)
	return nil
}

// UnmarshalScalar implements confmap.ScalarUnmarshaler: besides the strings
// of UnmarshalText it takes plain YAML numbers, which confmap would
// otherwise try to decode into the struct.
func (b *InflightBudget) UnmarshalScalar(sv confmap.ScalarValue) error {
	switch raw := sv.GetRaw().(type) {
	case *InflightBudget: // already decoded by UnmarshalText
		*b = *raw
		return nil
	case InflightBudget:
		*b = raw
		return nil
	case string:
		return b.UnmarshalText([]byte(raw))
	}
	n, err := sizeFromScalar(sv.GetRaw())
	if err != nil {
		return fmt.Errorf("%w; or \"auto\", or 0 for off", err)
	}
	*b = FixedInflightBudget(n)
	return nil
}
