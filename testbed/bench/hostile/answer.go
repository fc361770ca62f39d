// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// class is what became of one request.
type class int8

const (
	// classOK: accepted (2xx, gRPC OK).
	classOK class = iota
	// classBudget, classShed, classOpen: refused by the throttle, the
	// reason named in its refusal ("throttle: collector overloaded (budget)").
	classBudget
	classShed
	classOpen
	// classRefused: any other answer from the gateway that is not an
	// acceptance: another status, a refusal without the throttle's reason,
	// a stream or connection the gateway ended without an answer.
	classRefused
	// classError: no answer from the gateway: the client's own timeout, a
	// connection that could not be made.
	classError
	// classHeld: a hostile request still unanswered when its peer stopped
	// at the end of the round (the gateway was still holding it).
	classHeld
	numClasses
)

var classNames = [numClasses]string{"ok", "budget", "shed", "open", "refused", "error", "held"}

func (c class) String() string {
	if c >= 0 && c < numClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// throttleReason matches the throttle's refusal message and captures its
// reason.
var throttleReason = regexp.MustCompile(`throttle: collector overloaded \(([a-z]+)\)`)

// classifyMessage returns the class of a refusal from its message: the
// throttle's reason when the message names one, classRefused otherwise.
func classifyMessage(msg string) class {
	m := throttleReason.FindStringSubmatch(msg)
	if m == nil {
		return classRefused
	}
	switch m[1] {
	case "budget":
		return classBudget
	case "shed":
		return classShed
	case "open":
		return classOpen
	}
	return classRefused
}

// statusMessage returns the message of an OTLP/HTTP error body: a
// google.rpc.Status in protobuf or JSON (otlpreceiver and the throttle
// answer in the request's encoding), or the body itself, shortened.
func statusMessage(body []byte, contentType string) string {
	st := &spb.Status{}
	var err error
	if strings.HasPrefix(contentType, "application/json") {
		err = protojson.Unmarshal(body, st)
	} else {
		err = proto.Unmarshal(body, st)
	}
	if err == nil && st.GetMessage() != "" {
		return st.GetMessage()
	}
	return shorten(string(body), 200)
}

// classifyHTTP returns the class of an HTTP answer and, for a refusal, its
// message.
func classifyHTTP(code int, body []byte, contentType string) (class, string) {
	if code >= 200 && code < 300 {
		return classOK, ""
	}
	msg := statusMessage(body, contentType)
	return classifyMessage(msg), fmt.Sprintf("%d %s", code, msg)
}

// classifyGRPC returns the class of a gRPC call's error (nil: OK) and, for
// a refusal, its message. ownDeadline is whether the client's own deadline
// had passed: a DEADLINE_EXCEEDED then is the client giving up, not an
// answer. grpc-go reports a connection it could not make or lost as
// UNAVAILABLE, told apart by its messages.
func classifyGRPC(err error, ownDeadline bool) (class, string) {
	if err == nil {
		return classOK, ""
	}
	st, ok := status.FromError(err)
	if !ok {
		return classError, shorten(err.Error(), 200)
	}
	msg := st.Code().String() + " " + st.Message()
	switch st.Code() {
	case codes.OK:
		return classOK, ""
	case codes.DeadlineExceeded:
		if ownDeadline {
			return classError, msg
		}
	case codes.Unavailable:
		if !strings.Contains(st.Message(), "throttle:") && transportMessage(st.Message()) {
			return classError, msg
		}
	}
	return classifyMessage(st.Message()), shorten(msg, 200)
}

// transportMessage reports whether a gRPC UNAVAILABLE message is grpc-go's
// own for a connection it could not make or lost.
func transportMessage(msg string) bool {
	for _, s := range []string{"connection error", "transport", "EOF", "connection reset", "connection refused", "error reading from server"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func shorten(s string, n int) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// answer is one request of a normal client or the hostile peer and what
// became of it.
type answer struct {
	// who: "http" or "grpc" for the normal clients, the hostile peer's
	// kind of request for it.
	who string
	// sent and done are since the round's start; done is 0 for a request
	// still in flight.
	sent, done time.Duration
	class      class
	// items accepted (normal clients).
	items   int
	message string
}
