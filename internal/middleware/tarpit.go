// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MaxTarpitBody is the largest request body a tarpitted rejection reads: the
// amount net/http itself reads and discards from an unread body to keep the
// connection (maxPostHandlerReadBytes in net/http). A larger body, or one of
// unknown length (chunked, or compressed: confighttp then drops the length
// and hands over a decompressing reader, which reading would decompress), is
// answered at once, as without the tarpit.
const MaxTarpitBody = 256 << 10

// tarpitBufSize is the read size of the drain: larger than net/http's own
// discard, so a body takes fewer reads, and no larger, as the reads then
// only catch up with the sender and wait. A buffer is
// taken only while a body is read.
const tarpitBufSize = 16 << 10

// Tarpit holds shed and budget rejections of HTTP requests for a delay before
// they are answered, a bounded number at a time.
//
// Why: an early 429 is cheap but not free. The request pays for its
// connection, its headers, its handler chain and its garbage, so a client
// that ignores Retry-After and sends the next request as soon as it has an
// answer turns fast rejections into a load of their own (docs/results.md
// has the measurements). Held for a second, the same client has a request
// slot tied up instead, and sends less. A client that honours Retry-After
// only waits a little longer. This is nginx limit_req's "delay, then
// reject", applied to the rejections only.
//
// A held request costs its goroutine and connection, not its body: the body
// is read and discarded first, so neither the heap nor the kernel's socket
// buffers keep it. MaxHeld bounds how many are held at once; beyond it, and
// for Open rejections (which close the connection and should cost the least
// possible), the answer goes out at once.
//
// The cost of the tarpit falls on clients that share request slots between
// signals: held rejections of one signal occupy slots another (even an
// exempt one) would use. That, and compressed bodies not being tarpitted, is why
// it is off by default.
//
// One Tarpit is shared by every HTTP server of an extension. Its methods are
// safe for concurrent use.
type Tarpit struct {
	delay   time.Duration
	maxHeld int64
	held    atomic.Int64
	bufs    sync.Pool
	// closing ends every hold: the receivers are stopping.
	closing <-chan struct{}
}

// NewTarpit returns a Tarpit that holds rejections for delay, at most maxHeld
// at a time, or nil (no tarpit) when either is <= 0.
func NewTarpit(delay time.Duration, maxHeld int, closing <-chan struct{}) *Tarpit {
	if delay <= 0 || maxHeld <= 0 {
		return nil
	}
	p := &Tarpit{delay: delay, maxHeld: int64(maxHeld), closing: closing}
	p.bufs.New = func() any {
		b := make([]byte, tarpitBufSize)
		return &b
	}
	return p
}

// Held returns the number of rejections being held now. Nil-safe.
func (p *Tarpit) Held() int64 {
	if p == nil {
		return 0
	}
	return p.held.Load()
}

// Hold reads and discards r's body, then waits for the delay or until the
// request's context ends, whichever comes first, and reports whether it read
// the body (the connection can then be kept). It returns false at once,
// without reading anything, when p is nil, when MaxHeld requests are
// already held, when the body is not a known length of at most MaxTarpitBody
// bytes (a compressed body is of unknown length by then), or when the client
// waits for "100 Continue".
func (p *Tarpit) Hold(r *http.Request) bool {
	if p == nil || r.Body == nil || r.Body == http.NoBody || r.ContentLength < 0 || r.ContentLength > MaxTarpitBody {
		return false
	}
	// A client waiting for "100 Continue" has not sent its body and costs
	// little to refuse; reading would ask for the body, and holding
	// without reading does not work either: Go's and curl's clients send
	// the body anyway after waiting a second.
	if strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return false
	}
	if p.held.Add(1) > p.maxHeld {
		p.held.Add(-1)
		return false
	}
	defer p.held.Add(-1)

	buf := p.bufs.Get().(*[]byte)
	// One byte more than announced: net/http refuses a longer body, and the
	// limit keeps a broken reader from holding the goroutine.
	_, err := io.CopyBuffer(discardWriter{}, io.LimitReader(r.Body, r.ContentLength+1), *buf)
	p.bufs.Put(buf)
	if err != nil {
		return false // the connection is broken: answer (or fail) at once
	}

	t := time.NewTimer(p.delay)
	select {
	case <-t.C:
	case <-r.Context().Done():
		t.Stop()
	case <-p.closing:
		t.Stop()
	}
	return true
}

// discardWriter is io.Discard without ReaderFrom, so that io.CopyBuffer
// reads into the pooled buffer instead of io.Discard's 8 KiB one.
type discardWriter struct{}

func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
