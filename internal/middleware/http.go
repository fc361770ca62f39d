// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// readStep is the most a body's reservation grows by at once, and the most
// of it that may be ahead of what has been received once the body's head
// start (IdleTimeout) is over: a client that trickles its body holds about
// what it has sent, not what it has announced.
const readStep = 64 << 10

// HTTP is the HTTP server middleware. One HTTP may wrap any number of
// handlers; it is safe for concurrent use.
type HTTP struct {
	settings
	bodies *httpBodies
	// sizes learns, per signal, the size bodies turn out to have once read
	// (decompressed): what an admitted body of that signal reserves first.
	sizes   [decision.NumSignals]sizeWindow
	idleErr error
}

// NewHTTP returns the HTTP middleware for cfg.
func NewHTTP(cfg Config) (*HTTP, error) {
	s, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	return &HTTP{
		settings: s,
		bodies:   newHTTPBodies(),
		idleErr:  fmt.Errorf("throttle: no request body received for %v; the request is dropped to free its share of the admission budget", s.idle),
	}, nil
}

// Wrap returns next behind the throttle. For each request it classifies the
// URL path; an unclassified request goes straight to next. A classified one
// is decided; a denied request is answered 429 without its body being read,
// an admitted one is charged in the budget for its body, as it is read, for
// as long as next runs.
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
	if v := m.dec.Decide(sig); !v.Admitted() {
		if m.observe {
			m.rec.Record(ProtocolHTTP, sig, v)
			h.next.ServeHTTP(w, r)
			return
		}
		// Held, the body stays unread until a later decision admits it.
		if v = m.queue.Wait(r.Context(), sig, v); !v.Admitted() {
			m.reject(w, r, sig, v)
			return
		}
	}
	// An exempt signal bypasses the budget: only the memory backstop
	// (Decide) refuses it.
	if m.budget == nil || r.Body == nil || r.Body == http.NoBody || m.dec.Exempt(sig) {
		m.rec.Record(ProtocolHTTP, sig, decision.Admit)
		h.next.ServeHTTP(w, r)
		return
	}
	t := now()
	p := m.budget.peerOfRemote(r.RemoteAddr)
	initial := m.initialSize(sig, r.ContentLength, p, t)
	// An HTTP request does not wait for the budget (measured: design
	// §12), so the requests waiting in line for it (gRPC) do not hold it
	// back either.
	if !m.budget.admitNow(initial, p) {
		if m.observe {
			m.rec.Record(ProtocolHTTP, sig, decision.DenyBudget)
			h.next.ServeHTTP(w, r)
			return
		}
		m.reject(w, r, sig, decision.DenyBudget)
		return
	}
	m.rec.Record(ProtocolHTTP, sig, decision.Admit)
	body := m.newBody(w, r, sig, p, initial, t)
	// A deferred finish also runs while a panic unwinds, so a panicking
	// handler returns its bytes and the panic carries on unchanged.
	defer body.finish()
	// A shallow copy rather than mutating the caller's request (handlers
	// must not modify the request they are given).
	r2 := new(http.Request)
	*r2 = *r
	r2.Body = body
	h.next.ServeHTTP(w, r2)
}

// initialSize is what a body reserves when it is admitted: what bodies of
// its signal have lately turned out to be on this server (unknown_size
// before any), or its Content-Length if that is smaller. It is never more
// than the budget or the peer's share: a request larger than that could
// never be admitted, its client would retry until it dropped the data, so
// it starts with what it can have and grows as it is read.
func (m *HTTP) initialSize(sig decision.Signal, contentLength int64, p peer, t time.Duration) int64 {
	n := m.sizes[sig].get(t)
	if n == 0 {
		n = m.unknownSize
	}
	if contentLength >= 0 {
		n = min(n, contentLength)
	}
	return min(n, m.budget.maxFor(p))
}

func (m *HTTP) newBody(w http.ResponseWriter, r *http.Request, sig decision.Signal, p peer, initial int64, t time.Duration) *budgetBody {
	b := &budgetBody{
		rc:           r.Body,
		m:            m,
		ctx:          r.Context(),
		sig:          sig,
		peer:         p,
		known:        r.ContentLength,
		admitted:     t,
		waitLeft:     m.budget.wait,
		w:            waiter{age: t},
		reserved:     initial,
		lastProgress: t,
	}
	if m.idle > 0 {
		b.ctl = http.NewResponseController(w)
		b.mu.Lock() // the timer's func takes it: it must see b.idle set
		b.idle = time.AfterFunc(m.idle, b.idleCheck)
		b.mu.Unlock()
	}
	return b
}

func (m *HTTP) reject(w http.ResponseWriter, r *http.Request, sig decision.Signal, v decision.Verdict) {
	m.rec.Record(ProtocolHTTP, sig, v)
	read := false
	if v != decision.DenyOpen {
		read = m.pacer.Hold(r) // nil-safe; see Pacer for why and for what is held
	}
	closeConn := !read && closesConnection(r, v)
	writeHTTPRejection(w, r, m.bodies, v, m.retry.Draw(v), closeConn)
	if closeConn {
		closeUnread(w)
	}
}

// budgetBody charges the budget for a body as it is read. The body starts
// with the reservation it was admitted with; bytes beyond it are reserved
// before they are read, readStep at a time: a Read never pulls more than
// the reservation covers. When the budget is full the Read waits (at most
// the budget's wait in total, oldest bodies first) for bytes to be
// released, and then fails with a RESOURCE_EXHAUSTED status error, which
// otlpreceiver answers 429 + Retry-After. A chunked or compressed body
// therefore cannot bypass the budget while others hold part of it.
//
// Slow and silent clients cannot hold the budget: once the body is older
// than IdleTimeout it keeps at most readStep beyond what it has received,
// and a body that receives nothing for IdleTimeout fails (its connection's
// read deadline is moved into the past).
//
// A body that holds the whole budget runs alone: it is read on without
// further charge, bounded by the receiver's max_request_body_size rather
// than the budget. Refusing it would be a retryable error that could never
// succeed (the body would outgrow the budget on every retry), so the
// client would retry until it gives up and drops the data. A body known to
// be that large asks for the whole budget at once when it first has to
// wait, which stops new admissions until it has it.
type budgetBody struct {
	rc       io.ReadCloser
	m        *HTTP
	ctx      context.Context
	sig      decision.Signal
	peer     peer
	known    int64 // Content-Length; -1 when unknown
	admitted time.Duration
	ctl      *http.ResponseController // nil without IdleTimeout

	// Read's own state: Read is not called concurrently.
	waitLeft time.Duration
	w        waiter
	probe    [1]byte

	// mu guards what finish and idleCheck share with Read; it is never
	// held while reading or waiting, so neither can block behind a Read
	// stuck on the network.
	mu           sync.Mutex
	reserved     int64
	read         int64
	lastProgress time.Duration
	late         bool // older than IdleTimeout: no more head start
	uncharged    bool // a pending read may return more than is reserved
	inRead       bool
	eof          bool
	done         bool
	killed       bool
	idle         *time.Timer
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
	if b.m.idle > 0 {
		b.trimLocked(now())
	}
	avail := b.reserved - b.read
	alone := b.reserved >= b.m.budget.Max()
	need := b.needLocked(len(p))
	held := b.reserved
	b.mu.Unlock()

	if avail <= 0 && !alone {
		// Tell the end of the body from more of it first, so that a body
		// ending exactly at its reservation neither takes more nor waits.
		// The probed byte is covered by the growth below.
		n, err := b.rawRead(b.probe[:])
		if n == 0 {
			return 0, err
		}
		need = max(need, 1)
		if err != nil {
			// The body ended with this byte: nothing to wait for.
			need = 1
			b.m.budget.charge(need, b.peer)
		} else if got := b.m.budget.tryGrow(need, b.peer); got > 0 {
			need = got
		} else {
			if b.m.observe {
				// Counted, never failed: the bytes are in memory anyway.
				b.m.budget.charge(need, b.peer)
			} else {
				ok, waited := b.m.budget.waitGrow(b.ctx, &b.w, need, held, b.peer, b.waitLeft)
				b.waitLeft -= waited
				if !ok {
					return 0, b.m.budgetError()
				}
			}
		}
		if !b.add(need) {
			return 0, http.ErrBodyReadAfterClose
		}
		p[0] = b.probe[0]
		return 1, err
	}
	if !alone && int64(len(p)) > avail {
		p = p[:avail]
	}
	return b.rawRead(p)
}

// needLocked is how much the reservation grows by before a read of want
// bytes once it is used up: readStep at most, never beyond the whole
// budget, nor beyond a known length. A body known to be larger than the
// whole budget asks for all of it during its head start.
func (b *budgetBody) needLocked(want int) int64 {
	budgetMax := b.m.budget.Max()
	left := budgetMax - b.reserved
	if b.known >= budgetMax && !b.late {
		return left
	}
	n := min(int64(want), readStep, left)
	if b.known >= 0 {
		n = min(n, b.known-b.read)
	}
	return n
}

// trimLocked ends the head start of a body older than IdleTimeout: the
// part of its reservation more than readStep ahead of what it has
// received goes back to the budget, now and at every later read.
func (b *budgetBody) trimLocked(t time.Duration) {
	if t-b.admitted < b.m.idle {
		return
	}
	b.late = true
	if excess := b.reserved - (b.read + readStep); excess > 0 {
		b.reserved -= excess
		b.m.budget.release(excess, b.peer)
	}
}

// add records n bytes taken from the budget; after finish they go back at
// once.
func (b *budgetBody) add(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		b.m.budget.release(n, b.peer)
		return false
	}
	b.reserved += n
	return true
}

// rawRead reads from the underlying body and records the progress.
func (b *budgetBody) rawRead(p []byte) (int, error) {
	b.mu.Lock()
	b.inRead = true
	b.mu.Unlock()
	n, err := b.rc.Read(p)
	b.mu.Lock()
	b.inRead = false
	b.read += int64(n)
	if b.uncharged {
		b.uncharged = false
		if extra := b.read - b.reserved; extra > 0 && !b.done {
			b.reserved = b.read
			b.m.budget.charge(extra, b.peer)
		}
	}
	if n > 0 && b.m.idle > 0 {
		b.lastProgress = now()
	}
	if err == io.EOF {
		b.eof = true
	}
	killed := b.killed
	b.mu.Unlock()
	if err != nil && killed && !errors.Is(err, io.EOF) {
		err = b.m.idleErr
	}
	return n, err
}

// idleCheck runs IdleTimeout after the last progress it saw. A body that
// has received nothing for IdleTimeout while the handler waits in a read
// is cut off by moving its connection's read deadline into the past: the
// read fails, the handler returns and the reservation is released. (Only
// while a read is pending: once the body has ended, net/http reads the
// connection in the background and a deadline would end the connection
// under a request still being processed.)
func (b *budgetBody) idleCheck() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done || b.eof || b.killed {
		return
	}
	quiet := now() - b.lastProgress
	switch {
	case quiet < b.m.idle:
		b.idle.Reset(b.m.idle - quiet)
	case !b.inRead:
		// The handler is not reading: the stall is not the client's.
		b.idle.Reset(b.m.idle)
	default:
		b.killed = true
		if b.ctl.SetReadDeadline(aLongTimeAgo) != nil {
			// No deadline behind this ResponseWriter: at least give back
			// what has not been received; a read still pending is charged
			// when it returns (see rawRead).
			b.killed = false
			b.late = true
			if excess := b.reserved - b.read; excess > 0 && b.reserved < b.m.budget.Max() {
				b.reserved = b.read
				b.uncharged = true
				b.m.budget.release(excess, b.peer)
			}
		}
	}
}

// aLongTimeAgo is a read deadline in the past: it fails a pending read at
// once.
var aLongTimeAgo = time.Unix(1, 0)

func (b *budgetBody) Close() error { return b.rc.Close() }

// finish releases the whole reservation when the handler returns; reads
// after it fail rather than grow an orphaned reservation. A body read to
// its end teaches its size to the next bodies of its signal.
func (b *budgetBody) finish() {
	b.mu.Lock()
	b.done = true
	n := b.reserved
	b.reserved = 0
	if b.idle != nil {
		b.idle.Stop()
	}
	size, eof := b.read, b.eof
	b.mu.Unlock()
	b.m.budget.release(n, b.peer)
	if eof {
		b.m.sizes[b.sig].observe(size, now())
	}
}

// budgetError is the error a body read returns when the budget is full. It
// is a gRPC status error (RESOURCE_EXHAUSTED + RetryInfo) because that is
// what otlpreceiver understands: it answers it 429 with Retry-After, so the
// client retries instead of dropping the data as it would on a 400.
func (m *HTTP) budgetError() error {
	return m.rejections.get(decision.DenyBudget, m.retry.Draw(decision.DenyBudget))
}
