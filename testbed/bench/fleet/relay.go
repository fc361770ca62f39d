// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
)

// relay forwards the TCP connections it accepts on 127.0.0.1 to target,
// dialling from its own loopback source address, so that the gateway sees
// the agent behind it as a peer of its own, as agents on distinct nodes
// are (the agents themselves cannot choose a source address). Linux
// answers for all of 127.0.0.0/8, and copies TCP to TCP with splice, so it
// costs the machine little.
type relay struct {
	ln     net.Listener
	dialer net.Dialer
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startRelay listens on a free port of 127.0.0.1 and forwards to target
// from src.
func startRelay(src netip.Addr, target string) (*relay, error) {
	if !src.IsLoopback() {
		return nil, fmt.Errorf("relay source %s is not a loopback address", src)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{
		ln:     ln,
		dialer: net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))},
		target: target,
		conns:  map[net.Conn]struct{}{},
	}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the address the agent sends to.
func (r *relay) Addr() string { return r.ln.Addr().String() }

func (r *relay) accept() {
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

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	_ = c.Close()
}

func (r *relay) serve(in net.Conn) {
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
		pipe(out, in)
		close(done)
	}()
	pipe(in, out)
	<-done
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
func (r *relay) Close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
