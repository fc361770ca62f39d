// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/time/rate"
)

// Relay forwards the TCP connections it accepts on 127.0.0.1 to target,
// dialling from its own loopback source address, so that the server sees
// the client behind it as a peer of its own, as clients on distinct nodes
// are (collector exporters and grpc-js cannot choose a source address).
// Linux answers for all of 127.0.0.0/8, and copies TCP to TCP with splice,
// so it costs the machine little.
type Relay struct {
	ln     net.Listener
	dialer net.Dialer
	target string
	// limit, when set, bounds the bytes all its connections carry towards
	// target, together (SlowRelay).
	limit *rate.Limiter

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartRelay listens on a free port of 127.0.0.1 and forwards to target
// from src.
func StartRelay(src netip.Addr, target string) (*Relay, error) {
	return startRelay(src, target, nil)
}

// startRelay starts a relay whose connections towards target share limit
// (nil: none); set before the relay accepts, it is never written after.
func startRelay(src netip.Addr, target string, limit *rate.Limiter) (*Relay, error) {
	if !src.IsLoopback() {
		return nil, fmt.Errorf("relay source %s is not a loopback address", src)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{
		ln:     ln,
		dialer: net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))},
		target: target,
		limit:  limit,
		conns:  map[net.Conn]struct{}{},
	}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// SlowRelay is a relay from 127.0.0.1 to target that carries at most
// bytesPerSec towards it over all its connections: a slow backend whose
// own process stays healthy (its metrics answer).
func SlowRelay(target string, bytesPerSec int) (*Relay, error) {
	if bytesPerSec <= 0 {
		return nil, fmt.Errorf("relay rate %d: must be > 0", bytesPerSec)
	}
	return startRelay(netip.MustParseAddr("127.0.0.1"), target, rate.NewLimiter(rate.Limit(bytesPerSec), slowRelayChunk))
}

// slowRelayChunk is the most a slow relay forwards at once: small enough
// that the rate holds over a fraction of a second.
const slowRelayChunk = 16 << 10

// Addr is the address the client sends to.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go r.serve(c)
	}
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	_ = c.Close()
}

func (r *Relay) serve(in net.Conn) {
	defer r.wg.Done()
	if !r.track(in) {
		_ = in.Close()
		return
	}
	defer r.untrack(in)
	out, err := r.dialer.Dial("tcp", r.target)
	if err != nil {
		return
	}
	if !r.track(out) {
		_ = out.Close()
		return
	}
	defer r.untrack(out)
	done := make(chan struct{})
	go func() {
		if r.limit != nil {
			pipeLimited(out, in, r.limit)
		} else {
			pipe(out, in)
		}
		close(done)
	}()
	pipe(in, out)
	<-done
}

// pipeLimited is pipe towards the target at the limiter's rate.
func pipeLimited(dst, src net.Conn, l *rate.Limiter) {
	buf := make([]byte, slowRelayChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if l.WaitN(context.Background(), n) != nil {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// pipe copies src to dst until src ends, then ends dst's sending half, so
// that a half-close reaches the other side as it would without the relay.
func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// Close stops accepting, closes every connection and waits for the
// goroutines.
func (r *Relay) Close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
