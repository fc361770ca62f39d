package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"io"
	"net/http"
	"sync"

	"github.com/otelthrottle/throttle/internal/decision"
)

// HTTP is the HTTP server middleware. One HTTP may wrap any number of
// handlers; it is safe for concurrent use.
type HTTP struct {
	settings
	bodies *httpBodies
}

// NewHTTP returns the HTTP middleware for cfg.
func NewHTTP(cfg Config) (*HTTP, error) {
	s, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	return &HTTP{settings: s, bodies: newHTTPBodies()}, nil
}

// Wrap returns next behind the throttle. For each request it classifies the
// URL path; an unclassified request goes straight to next. A classified one
// is decided; a denied request is answered 429 without its body being read,
// an admitted one reserves its size in the budget for as long as next runs.
func (m *HTTP) Wrap(next http.Handler) http.Handler {
	return &httpHandler{m: m, next: next}
}

type httpHandler struct {
	m    *HTTP
	next http.Handler
}

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if r.URL == nil {
		h.next.ServeHTTP(w, r)
		return
	}
	sig, ok := m.cls.HTTP(r.URL.Path)
	if !ok {
		h.next.ServeHTTP(w, r)
		return
	}
	if m.dec.Exempt(sig) {
		m.rec.Record(ProtocolHTTP, sig, decision.Admit)
		h.next.ServeHTTP(w, r)
		return
	}
	if v := m.dec.Decide(sig); !v.Admitted() {
		m.reject(w, r, sig, v)
		return
	}
	if m.budget == nil {
		m.rec.Record(ProtocolHTTP, sig, decision.Admit)
		h.next.ServeHTTP(w, r)
		return
	}
	if r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody {
		m.serveUnknownSize(w, r, sig, h.next)
		return
	}
	// The body cannot be longer than Content-Length (net/http enforces it
	// for HTTP/1 and HTTP/2), so the reservation is exact and final.
	//
	// A body larger than the whole budget could never be reserved, and a
	// retryable 429 that can never succeed makes the client retry until it
	// gives up and drops the data. Such a request takes the whole budget
	// instead ("runs alone"): it is admitted only while nothing else is
	// reserved, and until then it gets the usual retryable DenyBudget,
	// which will succeed once the others finish. The receiver's
	// max_request_body_size still bounds it.
	n := min(r.ContentLength, m.budget.Max())
	if !m.budget.Reserve(n) {
		m.reject(w, r, sig, decision.DenyBudget)
		return
	}
	m.rec.Record(ProtocolHTTP, sig, decision.Admit)
	// A deferred release also runs while a panic unwinds, so a panicking
	// handler returns its bytes and the panic carries on unchanged.
	defer m.budget.Release(n)
	h.next.ServeHTTP(w, r)
}

// serveUnknownSize admits a request whose size is not known up front: it
// reserves unknownSize and hands next a body that charges the budget for
// every byte beyond it before reading it.
func (m *HTTP) serveUnknownSize(w http.ResponseWriter, r *http.Request, sig decision.Signal, next http.Handler) {
	initial := m.unknownSize
	if !m.budget.Reserve(initial) {
		m.reject(w, r, sig, decision.DenyBudget)
		return
	}
	m.rec.Record(ProtocolHTTP, sig, decision.Admit)
	body := &budgetBody{rc: r.Body, b: m.budget, reserved: initial, step: m.unknownSize, m: m}
	defer body.finish()
	// A shallow copy rather than mutating the caller's request (handlers
	// must not modify the request they are given).
	r2 := new(http.Request)
	*r2 = *r
	r2.Body = body
	next.ServeHTTP(w, r2)
}

func (m *HTTP) reject(w http.ResponseWriter, r *http.Request, sig decision.Signal, v decision.Verdict) {
	m.rec.Record(ProtocolHTTP, sig, v)
	if v != decision.DenyOpen {
		m.pacer.Hold(r) // nil-safe; see Pacer for why and for what is held
	}
	writeHTTPRejection(w, r, m.bodies, v, m.retry.Draw(v))
}

// budgetBody charges the budget for a body of unknown size as it is read.
// Bytes are reserved before they are read: a Read never pulls more than the
// reservation covers, and when the reservation cannot grow because others
// hold the rest of the budget, the Read fails with a RESOURCE_EXHAUSTED
// status error, which otlpreceiver answers 429 + Retry-After. A chunked
// body therefore cannot bypass the budget while others hold part of it.
//
// A body that already holds the whole budget runs alone, like a
// Content-Length over the budget: it is read on without further charge,
// bounded by the receiver's max_request_body_size rather than the budget.
// Refusing it would be a retryable error that could never succeed (the
// body would outgrow the budget on every retry), so the client would
// retry until it gives up and drops the data. Reserved never exceeds Max.
type budgetBody struct {
	rc   io.ReadCloser
	b    *Budget
	m    *HTTP
	step int64

	// mu guards the accounting; it is never held while reading, so finish
	// cannot block behind a Read stuck on the network.
	mu       sync.Mutex
	reserved int64
	read     int64
	done     bool
	probe    [1]byte
}

func (b *budgetBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return b.rc.Read(p)
	}
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return 0, http.ErrBodyReadAfterClose
	}
	avail := b.reserved - b.read
	switch {
	case avail > 0:
	case b.reserved >= b.b.Max():
		// Alone: this body holds the whole budget, nothing else can be
		// admitted until it finishes. Read on uncharged (see budgetBody).
		avail = int64(len(p))
	default:
		grow := b.b.reserveUpTo(min(int64(len(p)), b.step))
		if grow == 0 {
			b.mu.Unlock()
			return b.probeEOF()
		}
		b.reserved += grow
		avail = grow
	}
	b.mu.Unlock()

	if int64(len(p)) > avail {
		p = p[:avail]
	}
	n, err := b.rc.Read(p)
	b.mu.Lock()
	b.read += int64(n)
	b.mu.Unlock()
	return n, err
}

// probeEOF runs when the budget cannot cover one more byte because others
// hold part of it. A body that ends exactly at its reservation must still
// succeed, so one byte is read to tell "finished" from "too big": EOF is
// passed on, a byte means the body exceeds what the budget allows.
func (b *budgetBody) probeEOF() (int, error) {
	n, err := b.rc.Read(b.probe[:])
	switch {
	case n > 0:
		return 0, b.m.budgetError()
	case err != nil:
		return 0, err
	default:
		return 0, nil
	}
}

func (b *budgetBody) Close() error { return b.rc.Close() }

// finish releases the whole reservation when the handler returns; reads
// after it fail rather than grow an orphaned reservation.
func (b *budgetBody) finish() {
	b.mu.Lock()
	b.done = true
	n := b.reserved
	b.reserved = 0
	b.mu.Unlock()
	b.b.Release(n)
}

// budgetError is the error a body read returns when the budget is full. It
// is a gRPC status error (RESOURCE_EXHAUSTED + RetryInfo) because that is
// what otlpreceiver understands: it answers it 429 with Retry-After, so the
// client retries instead of dropping the data as it would on a 400.
func (m *HTTP) budgetError() error {
	return m.rejections.get(decision.DenyBudget, m.retry.Draw(decision.DenyBudget))
}
