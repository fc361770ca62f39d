// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"go.opentelemetry.io/collector/client"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

// HTTP is the HTTP server middleware. One HTTP may wrap any number of
// handlers; it is safe for concurrent use.
type HTTP struct {
	settings
	bodies  *httpBodies
	slowErr error
}

// NewHTTP returns the HTTP middleware for cfg.
func NewHTTP(cfg Config) (*HTTP, error) {
	s, err := newSettings(cfg)
	if err != nil {
		return nil, err
	}
	// The client is told the rate it fell short of.
	msg := "throttle: request body too slow; retry"
	if n, d := s.adm.MinBodyRate(); d > 0 {
		msg = fmt.Sprintf("throttle: request body slower than %d KiB per %v; retry", n>>10, d)
	}
	return &HTTP{
		settings: s,
		bodies:   newHTTPBodies(),
		slowErr:  RetryableError(msg, BudgetRetryDelay),
	}, nil
}

// Wrap returns next behind the throttle. For each request it classifies the
// URL path; an unclassified request goes straight to next. A classified one
// is decided; a refused request is answered 429 without its body being
// read, an admitted one is charged in the budget for its body, as it is
// read, for as long as next runs.
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
		m.unclassified(admission.ProtocolHTTP, r.URL.Path)
		h.next.ServeHTTP(w, r)
		return
	}
	length := r.ContentLength
	if r.Body == nil || r.Body == http.NoBody {
		length = 0 // nothing to charge
	}
	t, v := m.adm.Admit(r.Context(), admission.Request{
		Protocol: admission.ProtocolHTTP,
		Signal:   sig,
		Remote:   remoteAddr(r.RemoteAddr),
		Header:   r.Header,
		Auth:     authOf(r),
		Length:   length,
	})
	if !v.Admitted() {
		m.reject(w, r, v)
		return
	}
	if t == nil || r.Body == nil || r.Body == http.NoBody {
		if t != nil {
			defer t.Release(false)
		}
		h.next.ServeHTTP(w, r)
		return
	}
	b := &httpBody{t: t, m: m, rc: r.Body, rw: statusWriter{ResponseWriter: w}}
	// A deferred release also runs while a panic unwinds, so a panicking
	// handler returns its bytes and the panic carries on unchanged.
	defer b.release()
	t.Start(r.Context(), b, false)
	// A shallow copy rather than mutating the caller's request (handlers
	// must not modify the request they are given).
	r2 := new(http.Request)
	*r2 = *r
	r2.Body = b
	h.next.ServeHTTP(&b.rw, r2)
}

// remoteAddr is the address of an http.Request's RemoteAddr; invalid when
// it is not IP.
func remoteAddr(s string) netip.Addr {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr()
}

// authOf is the authenticated client of r, nil for none: confighttp's
// authenticator runs before the middleware.
func authOf(r *http.Request) admission.Auth {
	if a := client.FromContext(r.Context()).Auth; a != nil {
		return a
	}
	return nil
}

func (m *HTTP) reject(w http.ResponseWriter, r *http.Request, v decision.Verdict) {
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

// httpBody is an admitted request's body: it reads through the ticket,
// which charges the budget for it as it is read, and turns the ticket's
// errors into retryable ones. Slow and silent clients are cut off (Stall)
// by moving their connection's read deadline into the past: the read fails
// with a retryable error, 429 + Retry-After, since an honest client on a
// slow link retries rather than dropping its data on a 400.
type httpBody struct {
	t  *admission.Ticket
	m  *HTTP
	rc io.ReadCloser
	rw statusWriter
}

func (b *httpBody) Read(p []byte) (int, error) {
	n, err := b.t.Read(b.rc, p)
	switch {
	case err == nil:
	case errors.Is(err, admission.ErrBudget):
		err = b.m.rejections.get(decision.VerdictDenyBudget, b.m.retry.Draw(decision.VerdictDenyBudget))
	case errors.Is(err, admission.ErrOpen):
		err = b.m.rejections.get(decision.VerdictDenyOpen, b.m.retry.Draw(decision.VerdictDenyOpen))
	case errors.Is(err, admission.ErrIdle):
		err = b.m.slowErr
	}
	return n, err
}

func (b *httpBody) Close() error { return b.rc.Close() }

// Stall fails the body's pending read: its client has stopped sending, or
// the receivers are stopping. Only while a read is pending (the ticket
// knows): once the body has ended, net/http reads the connection in the
// background and a deadline would end it under a request still being
// handled.
func (b *httpBody) Stall() {
	_ = http.NewResponseController(b.rw.ResponseWriter).SetReadDeadline(aLongTimeAgo)
}

// release gives the request's bytes back: an accepted body teaches its
// size to the next ones of its key and signal.
func (b *httpBody) release() { b.t.Release(b.rw.accepted()) }

// aLongTimeAgo is a read deadline in the past: it fails a pending read at
// once.
var aLongTimeAgo = time.Unix(1, 0)

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
