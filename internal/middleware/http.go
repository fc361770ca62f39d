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
	// sizes learns, per peer and signal, the size bodies turn out to have
	// once read (decompressed) and accepted: what the next body of that
	// peer and signal reserves first.
	sizes   peerSizes
	slowErr error
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
		slowErr: RetryableError(fmt.Sprintf("throttle: request body slower than %d KiB per %v; retry", readStep>>10, s.idle),
			BudgetRetryDelay),
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
		m.unclassified(ProtocolHTTP, r.URL.Path)
		h.next.ServeHTTP(w, r)
		return
	}
	t := now()
	p := m.peers.ofRemote(r.RemoteAddr)
	m.peers.touch(p, t)
	if v := m.dec.Decide(sig); !v.Admitted() {
		if m.observe {
			m.rec.Record(ProtocolHTTP, sig, v)
			h.next.ServeHTTP(w, r)
			return
		}
		// Held, the body stays unread until a later decision admits it.
		if v = m.hold.Wait(r.Context(), sig, v, p); !v.Admitted() {
			m.reject(w, r, sig, v)
			return
		}
	}
	if m.budget == nil || r.Body == nil || r.Body == http.NoBody {
		m.rec.Record(ProtocolHTTP, sig, decision.VerdictAdmit)
		m.inflight.add(1)
		defer m.inflight.add(-1)
		h.next.ServeHTTP(w, r)
		return
	}
	initial := m.initialSize(sig, r.ContentLength, p, t)
	// Under pressure, a peer that owes the oversize lane is refused at once
	// what may need it, before it is decompressed up to its share.
	if (r.ContentLength < 0 || r.ContentLength > m.budget.maxFor(p)) && !m.observe &&
		m.budget.laneIndebted(p, t) && m.dec.Pressed(sig) {
		m.reject(w, r, sig, decision.VerdictDenyBudget)
		return
	}
	// An HTTP request does not wait for the budget (measured: design
	// §12), so the requests waiting in line for it (gRPC) do not hold it
	// back either. An exempt signal is bounded by the budget as the others
	// are, with an overdraft the others cannot take (admitExempt).
	if !m.budget.admitNow(initial, p) && (!m.dec.Exempt(sig) || !m.budget.admitExempt(initial, p)) {
		if m.observe {
			m.rec.Record(ProtocolHTTP, sig, decision.VerdictDenyBudget)
			h.next.ServeHTTP(w, r)
			return
		}
		m.reject(w, r, sig, decision.VerdictDenyBudget)
		return
	}
	m.rec.Record(ProtocolHTTP, sig, decision.VerdictAdmit)
	m.inflight.add(1)
	defer m.inflight.add(-1)
	body := m.newBody(w, r, sig, p, initial, t)
	// A deferred finish also runs while a panic unwinds, so a panicking
	// handler returns its bytes and the panic carries on unchanged.
	defer body.finish()
	// A shallow copy rather than mutating the caller's request (handlers
	// must not modify the request they are given).
	r2 := new(http.Request)
	*r2 = *r
	r2.Body = body
	h.next.ServeHTTP(&body.rw, r2)
}

// initialSize is what a body reserves when it is admitted: what bodies of
// its peer and signal have lately turned out to be (unknown_size before
// any), or its Content-Length if that is smaller. It is never more than its
// peer's share: a request larger than that could never be admitted, its
// client would retry until it dropped the data, so it starts with what it
// can have and grows as it is read.
func (m *HTTP) initialSize(sig decision.Signal, contentLength int64, p peer, t time.Duration) int64 {
	n := m.sizes.get(p, sig, t)
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
		rw:           statusWriter{ResponseWriter: w},
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
	if v == decision.VerdictDenyBudget {
		m.peers.refused(now())
	}
	read := false
	if v != decision.VerdictDenyOpen {
		read = m.tarpit.Hold(r) // nil-safe; see Tarpit for why and for what is held
	}
	closeConn := !read && closesConnection(r, v)
	if !read && !closeConn {
		boundDrain(w, r)
	}
	writeHTTPRejection(w, r, m.bodies, v, m.retry.Draw(v), closeConn)
	if closeConn {
		closeUnread(w)
	}
}

// statusWriter records the status the handler answers with, so that only
// an accepted body teaches its size (a body that failed to decode, or was
// refused by an authenticator, must not raise what the next ones reserve).
// Unwrap keeps http.ResponseController working through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps the wrapped writer's flushing visible to the handler.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// accepted reports whether the handler answered with a success (no
// answer written yet counts as one: net/http then sends 200).
func (w *statusWriter) accepted() bool { return w.status == 0 || (w.status >= 200 && w.status < 300) }

// budgetBody charges the budget for a body as it is read. The body starts
// with the reservation it was admitted with; bytes beyond it are reserved
// before they are read, readStep at a time: a Read never pulls more than
// the reservation covers. When the budget is full the Read waits (at most
// the budget's wait in total, oldest bodies first) for bytes to be
// released, and then fails with a RESOURCE_EXHAUSTED status error, which
// otlpreceiver answers 429 + Retry-After. A chunked or compressed body
// therefore cannot bypass the budget while others hold part of it.
//
// No body holds more than its peer's share: one whose own reservation has
// reached it goes on in the budget's oversize lane (Budget.acquireLane),
// reading on uncharged, one such body at a time, bounded by the receiver's
// max_request_body_size rather than the budget, so that a large honest
// batch is not refused for ever and the other peers lose nothing to it.
//
// Slow and silent clients cannot hold the budget or the lane: once the
// body is older than IdleTimeout it keeps at most readStep beyond what it
// has received, and a body that has not received readStep more within
// IdleTimeout is cut off (its connection's read deadline is moved into the
// past) with a retryable error, 429 + Retry-After: a byte now and then is
// no progress, and an honest client on a slow link retries rather than
// dropping its data on a 400.
type budgetBody struct {
	rc       io.ReadCloser
	m        *HTTP
	ctx      context.Context
	sig      decision.Signal
	peer     peer
	known    int64 // Content-Length; -1 when unknown
	admitted time.Duration
	ctl      *http.ResponseController // nil without IdleTimeout
	rw       statusWriter

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
	progressAt   int64 // read when lastProgress was last moved
	late         bool  // older than IdleTimeout: no more head start
	uncharged    bool  // a pending read may return more than is reserved
	lane         bool  // in the oversize lane: reads on uncharged
	laneToken    bool  // holds the lane's token (not in observe-only mode)
	laneRead     int64 // bytes read in the lane beyond the reservation
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
	lane := b.lane
	need := b.needLocked(len(p))
	held := b.reserved
	b.mu.Unlock()

	if lane {
		return b.rawRead(p)
	}
	if avail <= 0 {
		// Tell the end of the body from more of it first, so that a body
		// ending exactly at its reservation neither takes more nor waits.
		// The probed byte is covered by the growth below.
		n, err := b.rawRead(b.probe[:])
		if n == 0 {
			return 0, err
		}
		switch {
		case err != nil:
			// The body ended with this byte: nothing to wait for.
			need = 1
			b.m.budget.charge(need, b.peer)
		case b.m.budget.atShare(held, b.peer):
			// Its own reservation is its peer's whole share.
			if !b.m.observe && !b.m.budget.acquireLane(b.ctx, b.peer, b.m.dec.Pressed(b.sig), b.waitLeft) {
				return 0, b.m.budgetError()
			}
			b.enterLane(!b.m.observe)
			p[0] = b.probe[0]
			return 1, nil
		default:
			// Up to the share first; the lane only once it is all its own.
			need = min(need, b.m.budget.growFor(b.peer)-held)
			if got := b.m.budget.tryGrow(need, b.peer); got > 0 {
				need = got
			} else if b.m.observe {
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
	if int64(len(p)) > avail {
		p = p[:avail]
	}
	return b.rawRead(p)
}

// enterLane moves the body into the oversize lane: from here on it reads
// uncharged. token: it holds the lane's token (not in observe-only mode,
// which never waits for it). The probed byte that got it there is its
// first byte in the lane.
func (b *budgetBody) enterLane(token bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		if token {
			b.m.budget.releaseLane(b.peer, 0)
		}
		return
	}
	b.lane, b.laneToken = true, token
	b.laneRead++
	b.m.budget.laneBytes.Add(1)
}

// needLocked is how much the reservation grows by before a read of want
// bytes once it is used up: readStep at most, nor beyond a known length.
func (b *budgetBody) needLocked(want int) int64 {
	n := min(int64(want), readStep)
	if b.known >= 0 {
		n = min(n, b.known-b.read)
	}
	return max(n, 1)
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

// rawRead reads from the underlying body and records the progress: at
// least readStep more since the last progress, or the end of the body.
func (b *budgetBody) rawRead(p []byte) (int, error) {
	b.mu.Lock()
	b.inRead = true
	b.mu.Unlock()
	n, err := b.rc.Read(p)
	b.mu.Lock()
	b.inRead = false
	b.read += int64(n)
	if b.lane && !b.done {
		if extra := b.read - b.reserved - b.laneRead; extra > 0 {
			b.laneRead += extra
			b.m.budget.laneBytes.Add(extra)
		}
	}
	if b.uncharged {
		b.uncharged = false
		if extra := b.read - b.reserved; extra > 0 && !b.done {
			b.reserved = b.read
			b.m.budget.charge(extra, b.peer)
		}
	}
	if b.m.idle > 0 && (b.read-b.progressAt >= readStep || err == io.EOF) {
		b.lastProgress, b.progressAt = now(), b.read
	}
	if err == io.EOF {
		b.eof = true
	}
	killed := b.killed
	b.mu.Unlock()
	if err != nil && killed && !errors.Is(err, io.EOF) {
		err = b.m.slowErr
	}
	return n, err
}

// idleCheck runs IdleTimeout after the last progress it saw. A body that
// has not progressed for IdleTimeout while the handler waits in a read is
// cut off by moving its connection's read deadline into the past: the read
// fails, the handler returns and the reservation is released. (Only while
// a read is pending: once the body has ended, net/http reads the
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
			if excess := b.reserved - b.read; excess > 0 {
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

// finish releases the whole reservation and the lane when the handler
// returns; reads after it fail rather than grow an orphaned reservation. A
// body read to its end and accepted teaches its size to the next bodies of
// its peer and signal.
func (b *budgetBody) finish() {
	b.mu.Lock()
	b.done = true
	n := b.reserved
	b.reserved = 0
	if b.idle != nil {
		b.idle.Stop()
	}
	size, eof, token, laneRead := b.read, b.eof, b.laneToken, b.laneRead
	b.lane, b.laneToken, b.laneRead = false, false, 0
	b.mu.Unlock()
	// Learnt before the release, so that whoever sees the bytes back also
	// sees what the body taught.
	if eof && b.rw.accepted() {
		b.m.sizes.observe(b.peer, b.sig, size, now())
	}
	b.m.budget.release(n, b.peer)
	b.m.budget.laneBytes.Add(-laneRead)
	if token {
		b.m.budget.releaseLane(b.peer, laneRead)
	}
}

// budgetError is the error a body read returns when the budget is full. It
// is a gRPC status error (RESOURCE_EXHAUSTED + RetryInfo) because that is
// what otlpreceiver understands: it answers it 429 with Retry-After, so the
// client retries instead of dropping the data as it would on a 400.
func (m *HTTP) budgetError() error {
	m.peers.refused(now())
	return m.rejections.get(decision.VerdictDenyBudget, m.retry.Draw(decision.VerdictDenyBudget))
}
