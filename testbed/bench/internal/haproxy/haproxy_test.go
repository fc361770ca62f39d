// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package haproxy

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStats(t *testing.T) {
	text := "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,\n" +
		"otlp_http,FRONTEND,,,2,3,4096,7,100,50,0,0,0,,,,,OPEN,\n" +
		"gateways_http,r1,0,0,1,2,,4,60,30,,0,,0,0,0,0,UP,\n" +
		"gateways_http,r2,0,0,1,1,,3,40,20,,0,,0,0,0,0,DOWN,\n" +
		"gateways_http,BACKEND,0,0,2,3,410,7,100,50,0,0,,0,0,0,0,UP,\n" +
		"gateways_grpc,r1,0,0,0,0,,0,0,0,,0,,0,0,0,0,UP,\n\n"
	st, err := ParseStats(strings.NewReader(text), "gateways_http")
	require.NoError(t, err)
	assert.Equal(t, map[string]ServerStats{
		"r1": {Status: "UP", Conns: 1, ConnsTotal: 4},
		"r2": {Status: "DOWN", Conns: 1, ConnsTotal: 3},
	}, st)
	_, err = ParseStats(strings.NewReader("# pxname,svname\n"), "gateways_http")
	assert.ErrorContains(t, err, "no status column")
}
