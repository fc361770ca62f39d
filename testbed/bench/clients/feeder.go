// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
)

// feeder is the application in front of a stock collector agent: it POSTs
// batches over OTLP/HTTP to the agent's receiver, and a batch counts as
// handed once the agent has answered 2xx (the agent's exporter has it
// then). A refused batch is sent again a second later, until the end of
// the run.
type feeder struct {
	app
	target string
	// grace is how long past the duration a refused batch is retried.
	grace time.Duration
}

func runFeeder(args []string) error {
	f := &feeder{}
	fs := flag.NewFlagSet("feeder", flag.ContinueOnError)
	f.register(fs)
	fs.StringVar(&f.target, "target", "", "the agent's OTLP/HTTP traces URL")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "how long after the duration a refused batch is still retried")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	if f.target == "" {
		return errors.New("-target: the agent's URL is needed")
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: f.workers}}
	refused := &tally{}
	var nRefused atomic.Uint64
	giveUpAt := time.Now().Add(f.duration + f.grace)
	hand := func(seq, n uint64) (bool, error) {
		body, err := f.request(seq, n)
		if err != nil {
			return false, err
		}
		for {
			err := post(client, f.target, body)
			if err == nil {
				return true, nil
			}
			refused.add(err.Error())
			nRefused.Add(1)
			if time.Now().After(giveUpAt) {
				return false, nil
			}
			time.Sleep(time.Second)
		}
	}
	r := f.run(hand)
	r.Refused = nRefused.Load()
	r.Logs = refused.snapshot()
	r.Settings = map[string]string{"feeder": "OTLP/HTTP protobuf to the agent, refused batches sent again after 1s"}
	return r.write(f.out)
}

// request is the protobuf ExportTraceServiceRequest of the batch.
func (f *feeder) request(seq, n uint64) ([]byte, error) {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("service.name", f.name)
	ss := rs.ScopeSpans().AppendEmpty()
	ss.Scope().SetName("throttle/testbed/bench/clients")
	spans := ss.Spans()
	now := time.Now()
	for i := range n {
		tid, sid := encodeIDs(f.id, seq+i)
		sp := spans.AppendEmpty()
		sp.SetTraceID(pcommon.TraceID(tid))
		sp.SetSpanID(pcommon.SpanID(sid))
		sp.SetName("matrix-span")
		sp.SetKind(ptrace.SpanKindServer)
		sp.SetStartTimestamp(pcommon.NewTimestampFromTime(now.Add(-time.Millisecond)))
		sp.SetEndTimestamp(pcommon.NewTimestampFromTime(now))
		a := sp.Attributes()
		a.PutStr("matrix.client", f.name)
		a.PutStr("matrix.seq", strconv.FormatUint(seq+i, 10))
		a.PutStr("matrix.payload", payload(f.attrSize, seq+i))
	}
	return ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
}

func post(client *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("agent answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
