// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func at(who string, sec float64, c class) answer {
	return answer{who: who, sent: time.Duration(sec * float64(time.Second)), class: c}
}

func TestLongestBudgetStretch(t *testing.T) {
	s := func(as ...answer) (time.Duration, string, time.Duration) { return longestBudgetStretch(as) }

	d, p, _ := s(at("http", 1, classOK), at("http", 2, classShed))
	assert.Zero(t, d, "no budget refusal")
	assert.Empty(t, p)

	d, p, _ = s(at("http", 1, classBudget))
	assert.Zero(t, d, "one lone refusal")
	assert.Equal(t, "http", p)

	// Refusals of other reasons neither end nor extend a stretch; an
	// accepted request ends it.
	d, p, from := s(
		at("http", 1, classBudget), at("http", 2, classShed), at("http", 3.5, classBudget), at("http", 4, classError),
		at("http", 5, classOK), at("http", 6, classBudget), at("http", 7, classBudget),
	)
	assert.Equal(t, 2500*time.Millisecond, d)
	assert.Equal(t, "http", p)
	assert.Equal(t, time.Second, from)

	// Per protocol: gRPC's acceptances do not end HTTP's stretch, and the
	// answers' order does not matter.
	d, p, _ = s(
		at("grpc", 2, classOK), at("http", 4, classBudget), at("grpc", 3, classOK), at("http", 1, classBudget),
		at("grpc", 1, classBudget), at("grpc", 1.5, classBudget),
	)
	assert.Equal(t, 3*time.Second, d)
	assert.Equal(t, "http", p)
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want class
	}{
		{"throttle: collector overloaded (budget)", classBudget},
		{"throttle: collector overloaded (shed)", classShed},
		{"throttle: collector overloaded (open)", classOpen},
		{"throttle: collector overloaded (other)", classRefused},
		{"request body too large", classRefused},
	} {
		assert.Equal(t, tc.want, classifyMessage(tc.msg), tc.msg)
	}
	c, msg := classifyHTTP(429, []byte(`{"code":8,"message":"throttle: collector overloaded (budget)"}`), "application/json")
	assert.Equal(t, classBudget, c)
	assert.Contains(t, msg, "429")
	c, _ = classifyHTTP(200, nil, "")
	assert.Equal(t, classOK, c)
	c, _ = classifyHTTP(400, []byte("plain text"), "text/plain")
	assert.Equal(t, classRefused, c)

	c, _ = classifyGRPC(status.Error(codes.ResourceExhausted, "throttle: collector overloaded (open)"), false)
	assert.Equal(t, classOpen, c)
	c, _ = classifyGRPC(status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true)
	assert.Equal(t, classError, c, "the client's own timeout is no answer")
	c, _ = classifyGRPC(status.Error(codes.Canceled, "stream terminated by RST_STREAM"), false)
	assert.Equal(t, classRefused, c, "a stream the gateway ended is a refusal")
	c, _ = classifyGRPC(status.Error(codes.Unavailable, "connection error: desc = transport is closing"), false)
	assert.Equal(t, classError, c)
	c, _ = classifyGRPC(errors.New("not a status"), false)
	assert.Equal(t, classError, c)
	c, _ = classifyGRPC(nil, false)
	assert.Equal(t, classOK, c)
}

func TestCheck(t *testing.T) {
	r := &roundResult{pair: 1, acceptedItemsS: 960, baselineItemsS: 1000}
	r.normal[classOK] = 100
	assert.True(t, r.check().pass())

	r.acceptedItemsS = 940
	assert.False(t, r.check().throughput)

	r = &roundResult{pair: 1, acceptedItemsS: 1000, baselineItemsS: 1000, longestBudget: 2100 * time.Millisecond}
	assert.False(t, r.check().budget)

	// The refusals must fall on the hostile peer.
	r = &roundResult{pair: 1, acceptedItemsS: 1000, baselineItemsS: 1000}
	r.normal[classOK], r.normal[classShed] = 90, 10
	r.hostile[classHeld] = 3
	assert.False(t, r.check().hostileRefused, "normal clients refused, the hostile peer held")
	r.hostile[classRefused] = 30
	assert.True(t, r.check().hostileRefused)
	// A few refusals more than the baseline's are noise, not harm.
	r = &roundResult{pair: 1, acceptedItemsS: 1000, baselineItemsS: 1000, baselineRefused: 0.002}
	r.normal[classOK], r.normal[classShed] = 996, 4
	r.hostile[classOK] = 30
	assert.True(t, r.check().hostileRefused, "0.4 %% refused where the baseline refused 0.2 %%")
	r.normal[classOK], r.normal[classShed] = 990, 10
	assert.True(t, r.check().hostileRefused, "1 %% refused where the baseline refused 0.2 %%")
	r.normal[classOK], r.normal[classShed] = 985, 15
	assert.False(t, r.check().hostileRefused, "1.5 %% refused where the baseline refused 0.2 %%")

	r.oomKills = 1
	assert.False(t, r.check().noOOM)
}
