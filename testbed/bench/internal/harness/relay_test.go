// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRelay: a connection through the relay reaches the target from the
// relay's source address, carries bytes both ways and passes a half-close
// on; Close ends the connections still open.
func TestRelay(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer target.Close()
	remotes := make(chan string, 2)
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			remotes <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().String()
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = io.WriteString(c, "echo "+line)
			}()
		}
	}()

	r, err := StartRelay(netip.MustParseAddr("127.0.0.23"), target.Addr().String())
	require.NoError(t, err)
	c, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err)
	_, err = io.WriteString(c, "hello\n")
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, "echo hello\n", string(got))
	assert.Equal(t, "127.0.0.23", <-remotes, "the target sees the relay's source address")
	c.Close()

	idle, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err)
	defer idle.Close()
	<-remotes
	r.Close()
	require.NoError(t, idle.SetReadDeadline(time.Now().Add(time.Minute)))
	_, err = idle.Read(make([]byte, 1))
	require.Error(t, err, "closed by the relay")

	_, err = StartRelay(netip.MustParseAddr("10.0.0.1"), target.Addr().String())
	require.Error(t, err, "a source outside loopback")
}

// TestSlowRelay: a slow relay carries every byte towards its target, and
// no faster than its rate allows after the first chunk; the answers come
// back unchanged.
func TestSlowRelay(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer target.Close()
	go func() {
		c, err := target.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		_, _ = fmt.Fprintf(c, "%d", n)
	}()
	const rate = 64 << 10
	r, err := SlowRelay(target.Addr().String(), rate)
	require.NoError(t, err)
	defer r.Close()
	c, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err)
	defer c.Close()
	body := make([]byte, slowRelayChunk+rate/2)
	start := time.Now()
	_, err = c.Write(body)
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, strconv.Itoa(len(body)), string(got), "every byte reached the target")
	assert.GreaterOrEqual(t, time.Since(start), 400*time.Millisecond, "half a second of bytes beyond the first chunk, at the rate")

	_, err = SlowRelay(target.Addr().String(), 0)
	require.ErrorContains(t, err, "must be > 0")
}
