package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import "sync/atomic"

// Budget bounds the bytes reserved by admitted, unfinished requests. It is
// lock-free (one CAS per reservation) and shared by every server of one
// extension. A nil *Budget is valid and unlimited: Reserve always succeeds
// and Reserved is 0, which is how max_inflight_bytes: 0 disables it.
type Budget struct {
	max      int64
	reserved atomic.Int64
	// Padding keeps the high-water mark, read on every reservation but
	// rarely written, off the line of reserved, which every request writes.
	_    [56]byte
	high atomic.Int64
}

// NewBudget returns a budget of maxBytes; maxBytes <= 0 returns nil (no
// budget).
func NewBudget(maxBytes int64) *Budget {
	if maxBytes <= 0 {
		return nil
	}
	return &Budget{max: maxBytes}
}

// Reserve takes n bytes from the budget if they fit and reports whether they
// did. It never blocks. n <= 0 always fits and reserves nothing.
func (b *Budget) Reserve(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	for {
		cur := b.reserved.Load()
		// Written as a subtraction so a huge n cannot overflow.
		if n > b.max-cur {
			return false
		}
		next := cur + n
		if b.reserved.CompareAndSwap(cur, next) {
			for {
				h := b.high.Load()
				if next <= h || b.high.CompareAndSwap(h, next) {
					return true
				}
			}
		}
	}
}

// reserveUpTo takes min(n, what is left) bytes and returns how many it
// took (0 when the budget is full). A body of unknown size grows its
// reservation with it, so it can use the budget to the last byte.
func (b *Budget) reserveUpTo(n int64) int64 {
	for {
		cur := b.reserved.Load()
		take := min(n, b.max-cur)
		if take <= 0 {
			return 0
		}
		next := cur + take
		if b.reserved.CompareAndSwap(cur, next) {
			for {
				h := b.high.Load()
				if next <= h || b.high.CompareAndSwap(h, next) {
					return take
				}
			}
		}
	}
}

// charge adds n bytes that are already in memory (a gRPC message larger
// than its estimate, once received): they are counted even beyond the
// budget, so that the budget shows them and refuses others meanwhile.
func (b *Budget) charge(n int64) {
	if b == nil || n <= 0 {
		return
	}
	next := b.reserved.Add(n)
	for {
		h := b.high.Load()
		if next <= h || b.high.CompareAndSwap(h, next) {
			return
		}
	}
}

// Release returns n bytes taken by a successful Reserve(n).
func (b *Budget) Release(n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.reserved.Add(-n)
}

// Reserved returns the bytes currently reserved (the inflight_bytes gauge).
// gRPC messages larger than their estimate can take it over Max while they
// are handled.
func (b *Budget) Reserved() int64 {
	if b == nil {
		return 0
	}
	return b.reserved.Load()
}

// Max returns the size of the budget; 0 for a nil (unlimited) budget.
func (b *Budget) Max() int64 {
	if b == nil {
		return 0
	}
	return b.max
}

// HighWater returns the largest value Reserved has reached. It exists for
// tests and diagnostics.
func (b *Budget) HighWater() int64 {
	if b == nil {
		return 0
	}
	return b.high.Load()
}
