// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// The hostile peers of the findings' scenarios (setups.go has their
// gateways and targets).

// shrinkWaves is the grpc-shrink peer (prime) and its control: a wave of
// -shrink-calls concurrent Exports of the shrink message (4 MB of
// attribute, kept in memory until exported) every -shrink-every, after one
// accepted empty Export when prime. The empty Export teaches the gateway
// that the peer's messages are empty, so that its next calls reserve the
// 4 KiB floor each while grpc-go decompresses and decodes 4 MB for every
// one of them; the size is learnt for 10 to 20 s, so that a wave every
// -shrink-every (more) starts from it again.
func (e *peerEnv) shrinkWaves(ctx context.Context, prime bool) error {
	o := e.o
	conns := make([]*grpc.ClientConn, o.shrinkConns)
	for i := range conns {
		c, err := dialGRPC(hostileAddr, e.grpcAddr)
		if err != nil {
			return err
		}
		defer c.Close()
		conns[i] = c
	}
	big, err := prepare(ctx, conns[0], e.payloads.shrink)
	if err != nil {
		return err
	}
	empty, err := prepare(ctx, conns[0], []byte{})
	if err != nil {
		return err
	}
	kind := "grpc-4MB"
	if prime {
		kind = "grpc-4MB-shrunk"
	}
	for ctx.Err() == nil {
		waveStart := time.Now()
		if prime && !e.primeEmpty(ctx, conns[0], empty) {
			return nil
		}
		// Every call's headers go out first, and their messages only once
		// all are open: the gateway admits each call when its headers
		// arrive, before any message has been decoded.
		var wg, opened sync.WaitGroup
		send := make(chan struct{})
		opened.Add(o.shrinkCalls)
		for i := range o.shrinkCalls {
			wg.Go(func() {
				r := e.peer.begin(kind)
				cctx, cancel := context.WithTimeout(ctx, o.shrinkTimeout)
				err := callAfter(cctx, conns[i%len(conns)], big, opened.Done, send)
				own := cctx.Err() != nil
				cancel()
				e.endGRPC(ctx, r, err, own)
			})
		}
		waitTimeout(&opened, shrinkOpenWait)
		close(send)
		wg.Wait()
		sleep(ctx, time.Until(waveStart.Add(o.shrinkEvery)))
	}
	return nil
}

// shrinkOpenWait bounds how long a wave waits for all its calls to be open
// before their messages go out.
const shrinkOpenWait = 5 * time.Second

// waitTimeout waits for wg, at most d.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// primeEmpty sends empty Exports until one is accepted (a refused one
// teaches nothing), minCycle apart; false when ctx ended first.
func (e *peerEnv) primeEmpty(ctx context.Context, conn *grpc.ClientConn, empty *grpc.PreparedMsg) bool {
	for ctx.Err() == nil {
		r := e.peer.begin("grpc-empty")
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := callPrepared(cctx, conn, empty)
		own := cctx.Err() != nil
		cancel()
		e.endGRPC(ctx, r, err, own)
		if err == nil {
			return true
		}
		if !pause(ctx, r.lifetime()) {
			return false
		}
	}
	return false
}

// laneTrickleLane sends the lane-trickle body: its head at once, beyond
// its peer's share, so that it takes the oversize lane, then its tail at
// -lane-rate bytes a second, one chunk a second. Each chunk decompresses
// to tens of KiB: the body keeps making progress as the gateway counts it
// (in decompressed bytes) while hardly anything comes over the wire.
func (e *peerEnv) laneTrickleLane(ctx context.Context) {
	ls, rate := e.payloads.lane, e.o.laneRate
	e.rawLane(ctx, "lane-trickle", func(ctx context.Context, conn net.Conn) {
		if _, err := conn.Write(append(e.requestHead("Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"), chunk(ls.head)...)); err != nil {
			return
		}
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for off := 0; off < len(ls.tail); off += rate {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := conn.Write(chunk(ls.tail[off:min(off+rate, len(ls.tail))])); err != nil {
				return
			}
		}
		_, _ = conn.Write([]byte("0\r\n\r\n"))
	})
}

// silentBodyLane sends, from src, chunked requests that send their
// headers and no body byte: each reserves what a request of unknown
// length does until the gateway cuts it; then the next.
func (e *peerEnv) silentBodyLane(ctx context.Context, src netip.Addr) {
	head := e.requestHead("Transfer-Encoding: chunked\r\n")
	e.rawLaneFrom(ctx, src, "silent-chunked", func(_ context.Context, conn net.Conn) {
		_, _ = conn.Write(head)
	})
}

// abortAfter is how long an aborted request stays open: long enough for
// the gateway to admit it and start reading its body.
const abortAfter = 50 * time.Millisecond

// abortedBodyLane sends, from src, chunked requests that send their
// headers and close the connection abortAfter later without a body byte.
func (e *peerEnv) abortedBodyLane(ctx context.Context, src netip.Addr) {
	head := e.requestHead("Transfer-Encoding: chunked\r\n")
	e.rawLaneFrom(ctx, src, "aborted-chunked", func(ctx context.Context, conn net.Conn) {
		if _, err := conn.Write(head); err != nil {
			return
		}
		sleep(ctx, abortAfter)
		_ = conn.Close()
	})
}

// exemptLane sends, from src, the uncompressed metrics body back to back
// on one connection (metrics are exempt in the exempt-overdraft gateway).
func (e *peerEnv) exemptLane(ctx context.Context, src netip.Addr) {
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 5 * time.Second}
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext, MaxIdleConnsPerHost: 1, DisableCompression: true}}
	defer c.CloseIdleConnections()
	body := e.payloads.exemptBody.Body
	for ctx.Err() == nil {
		r := e.peer.begin("exempt-metrics")
		e.post(ctx, c, r, "/v1/metrics", body, false)
		if !pause(ctx, r.lifetime()) {
			return
		}
	}
}

// shutdownSettle is how long after the trickling body the shutdown peer
// opens its waiting Exports: the body holds its peer's share by then.
const shutdownSettle = 2 * time.Second

// shutdownPeer is the shutdown scenario's peer: the lane-trickle body,
// and -shutdown-streams Exports with a deadline of -shutdown-deadline from
// the same address, which wait for bytes its share does not have (the
// body holds it) for most of their deadline; each is sent again when it
// ends.
func (e *peerEnv) shutdownPeer(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { e.laneTrickleLane(ctx) })
	sleep(ctx, shutdownSettle)
	if ctx.Err() != nil || e.o.shutdownStreams == 0 {
		return nil
	}
	conn, err := dialGRPC(hostileAddr, e.grpcAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	pm, err := prepare(ctx, conn, e.payloads.small)
	if err != nil {
		return err
	}
	for range e.o.shutdownStreams {
		wg.Go(func() {
			for ctx.Err() == nil {
				r := e.peer.begin("grpc-waiting-export")
				cctx, cancel := context.WithTimeout(ctx, e.o.shutdownDeadline)
				err := callPrepared(cctx, conn, pm)
				own := cctx.Err() != nil
				cancel()
				e.endGRPC(ctx, r, err, own)
				if !pause(ctx, r.lifetime()) {
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}
