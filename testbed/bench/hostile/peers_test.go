// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatewayStub serves handler on 127.0.0.1 as the gateway the raw lanes
// talk to, and returns its address.
func gatewayStub(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// A raw request is recorded with the class of the gateway's answer, from
// the hostile peer's address, and the lane opens the next one on a new
// connection; one the gateway still holds when the round ends is held.
func TestRawLaneRecordsAnswers(t *testing.T) {
	peers := make(chan string, 100)
	refuse := gatewayStub(t, func(w http.ResponseWriter, r *http.Request) {
		peers <- r.RemoteAddr
		w.Header().Set("Connection", "close")
		http.Error(w, "throttle: collector overloaded (budget)", http.StatusTooManyRequests)
	})
	e := &peerEnv{o: &options{}, peer: newPeer(time.Now()), httpAddr: refuse, normalDecoded: 1000}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	e.heldBodyLane(ctx)
	reqs := e.peer.snapshot()
	require.GreaterOrEqual(t, len(reqs), 2, "a new request after each answer")
	for _, a := range reqs {
		assert.Equal(t, "http-held-body", a.who)
		assert.Equal(t, classBudget, a.class, a.message)
	}
	assert.Zero(t, e.peer.open.Load())
	close(peers)
	for p := range peers {
		assert.True(t, strings.HasPrefix(p, hostileAddr.String()+":"), p)
	}

	release := make(chan struct{})
	defer close(release)
	hold := gatewayStub(t, func(http.ResponseWriter, *http.Request) { <-release })
	e = &peerEnv{o: &options{}, peer: newPeer(time.Now()), httpAddr: hold, normalDecoded: 1000}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	e.heldBodyLane(ctx)
	reqs = e.peer.snapshot()
	require.Len(t, reqs, 1)
	assert.Equal(t, classHeld, reqs[0].class)
}
