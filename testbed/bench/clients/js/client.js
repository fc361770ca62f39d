// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// A client process of the client matrix (testbed/bench/clients): the
// OpenTelemetry JavaScript SDK's OTLP trace exporter over HTTP (protobuf,
// @opentelemetry/exporter-trace-otlp-proto) or gRPC
// (@opentelemetry/exporter-trace-otlp-grpc), default settings but the
// endpoint and the options below, which only the matrix's variants set.
//
// The "application" is the Go clients' loop (app.go): workers that hand
// fixed batches to exporter.export one at a time, as a BatchSpanProcessor
// does, at a rate shared by the workers; like the BatchSpanProcessor, a
// worker stops waiting for an export after --export-timeout-millis (its
// exportTimeoutMillis, 30 s by default) and counts it as failed. The spans
// are made by the SDK's own tracer (@opentelemetry/sdk-trace-base) with an
// ID generator that encodes the client and a sequence number (ids.go):
//
//   trace ID: "thro" | client id (uint32) | seq (uint64); span ID: seq + 1
//
// At the end it writes the result (ids.go's result) as JSON to --result.
'use strict';

const fs = require('node:fs');
const { parseArgs } = require('node:util');
const { diag, DiagLogLevel, SpanKind } = require('@opentelemetry/api');
const { BasicTracerProvider } = require('@opentelemetry/sdk-trace-base');
const { OTLPTraceExporter: ProtoExporter } = require('@opentelemetry/exporter-trace-otlp-proto');
const { OTLPTraceExporter: GrpcExporter } = require('@opentelemetry/exporter-trace-otlp-grpc');

const { values: opt } = parseArgs({
  options: {
    protocol: { type: 'string', default: 'http' },
    endpoint: { type: 'string' },
    bind: { type: 'string', default: '' },
    id: { type: 'string', default: '1' },
    name: { type: 'string', default: 'client' },
    workers: { type: 'string', default: '4' },
    batch: { type: 'string', default: '512' },
    rate: { type: 'string', default: '1000' },
    duration: { type: 'string', default: '30' }, // seconds
    'attr-size': { type: 'string', default: '64' },
    'timeout-millis': { type: 'string', default: '' }, // the exporter's timeoutMillis ('' = default)
    'export-timeout-millis': { type: 'string', default: '30000' }, // the BatchSpanProcessor's
    compression: { type: 'string', default: '' }, // 'gzip' ('' = the default, none)
    result: { type: 'string' },
  },
});

const id = Number(opt.id);
const workers = Number(opt.workers);
const batch = Number(opt.batch);
const rate = Number(opt.rate);
const durationMs = Number(opt.duration) * 1000;
const attrSize = Number(opt['attr-size']);
const exportTimeoutMillis = Number(opt['export-timeout-millis']);
if (!opt.endpoint || !opt.result || !(id > 0) || !(workers >= 1) || !(batch >= 1) || !(rate >= 0)) {
  console.error('client.js: --endpoint and --result are needed; --id, --workers, --batch > 0; --rate >= 0');
  process.exit(2);
}

// What the SDK logs (diag) goes to the result, counted by text with the
// numbers folded (as ids.go's foldDigits).
const logs = new Map();
const errors = new Map();
const fold = (s) => String(s).replace(/[0-9]+(\.[0-9]+)?/g, 'N').trim().slice(0, 300);
const count = (m, s) => m.set(fold(s), (m.get(fold(s)) || 0) + 1);
const logAt = (level) => (msg, ...args) => count(logs, `${level}: ${msg}${args.length ? ' ' + args.map(String).join(' ') : ''}`);
diag.setLogger({
  error: logAt('error'), warn: logAt('warn'), info: logAt('info'), debug: () => {}, verbose: () => {},
}, DiagLogLevel.INFO);

// Exporter: defaults but the endpoint, unless a variant's option is given.
const settings = {};
const config = {};
if (opt['timeout-millis'] !== '') {
  config.timeoutMillis = Number(opt['timeout-millis']);
  settings.timeoutMillis = String(config.timeoutMillis);
} else {
  settings.timeoutMillis = 'default (10000)';
}
if (opt.compression !== '') {
  config.compression = opt.compression;
  settings.compression = opt.compression;
} else {
  settings.compression = 'default (none)';
}
settings['exportTimeoutMillis (BatchSpanProcessor)'] = String(exportTimeoutMillis);
let exporter;
if (opt.protocol === 'http') {
  config.url = `http://${opt.endpoint}/v1/traces`;
  if (opt.bind) {
    // The exporter's default agent options ({ keepAlive: true }) and the
    // source address.
    config.httpAgentOptions = { keepAlive: true, localAddress: opt.bind };
    settings['source address'] = opt.bind;
  }
  exporter = new ProtoExporter(config);
  settings.exporter = '@opentelemetry/exporter-trace-otlp-proto ' + require('@opentelemetry/exporter-trace-otlp-proto/package.json').version;
} else if (opt.protocol === 'grpc') {
  // grpc-js has no option for a source address: the driver relays it.
  config.url = `http://${opt.endpoint}`;
  exporter = new GrpcExporter(config);
  settings.exporter = '@opentelemetry/exporter-trace-otlp-grpc ' + require('@opentelemetry/exporter-trace-otlp-grpc/package.json').version;
} else {
  console.error(`client.js: --protocol ${opt.protocol}: want http or grpc`);
  process.exit(2);
}

// The tracer: every span it ends goes to `finished`; the ID generator hands
// out the IDs set in `nextSeq` before each span starts.
const hex = (n, width) => n.toString(16).padStart(width, '0');
let nextSeq = 0;
let finished = [];
const provider = new BasicTracerProvider({
  idGenerator: {
    generateTraceId: () => '7468726f' + hex(id, 8) + hex(nextSeq, 16),
    generateSpanId: () => hex(nextSeq + 1, 16),
  },
  spanProcessors: [{
    onStart() {},
    onEnd(span) { finished.push(span); },
    forceFlush: () => Promise.resolve(),
    shutdown: () => Promise.resolve(),
  }],
});
const tracer = provider.getTracer('throttle/testbed/bench/clients');

// The payload attribute: cut from a pool of varied printable text (app.go).
const alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_';
let pool = '';
for (let i = 0; i < 65536; i++) pool += alphabet[Math.floor(Math.random() * alphabet.length)];
const payload = (seq) => {
  const size = Math.min(attrSize, pool.length);
  const off = (seq * 7919) % (pool.length - size + 1);
  return pool.slice(off, off + size);
};

function makeBatch(seq, n) {
  finished = [];
  for (let i = 0; i < n; i++) {
    nextSeq = seq + i;
    const span = tracer.startSpan('matrix-span', {
      kind: SpanKind.SERVER,
      attributes: { 'matrix.client': opt.name, 'matrix.seq': seq + i, 'matrix.payload': payload(seq + i) },
    });
    span.end();
  }
  return finished;
}

// exportBatch resolves with null on success or the error text, giving up
// after exportTimeoutMillis as the BatchSpanProcessor does (the export
// itself goes on).
function exportBatch(spans) {
  return new Promise((resolve) => {
    let done = false;
    const timer = setTimeout(() => {
      if (!done) { done = true; resolve('BatchSpanProcessor: Timeout'); }
    }, exportTimeoutMillis);
    exporter.export(spans, (res) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (res.code === 0) { // ExportResultCode.SUCCESS
        resolve(null);
        return;
      }
      const e = res.error;
      let text = e ? String(e.message || e) : 'export failed (no error)';
      if (e && e.code !== undefined && !text.startsWith(String(e.code))) text = `code ${e.code}: ${text}`;
      if (e && e.data) text += ` (body: ${String(e.data).slice(0, 200)})`;
      resolve(text);
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const res = {
    client: opt.name, id, seq_end: 0, handed: 0, ok: 0, given_up: 0, given_up_ranges: [], not_handed: [],
    refused: 0, exports: 0, latency_ms: null, errors: {}, logs: {}, settings, seconds: 0,
  };
  const latencies = [];
  let seqNext = 0;
  const start = Date.now();
  const end = start + durationMs;
  const period = rate > 0 ? 1000 * batch * workers / rate : 0;
  const worker = async (w) => {
    let next = start + period * w / workers;
    for (;;) {
      let now = Date.now();
      if (next > now) {
        if (next >= end) return;
        await sleep(next - now);
        now = Date.now();
      }
      if (now >= end) return;
      next = Math.max(next, now) + period;
      const seq = seqNext;
      seqNext += batch;
      const spans = makeBatch(seq, batch);
      const t0 = Date.now();
      const err = await exportBatch(spans);
      latencies.push(Date.now() - t0);
      res.exports++;
      res.handed += batch;
      if (err === null) {
        res.ok += batch;
      } else {
        res.given_up += batch;
        res.given_up_ranges.push({ start: seq, len: batch });
        count(errors, err);
      }
    }
  };
  await Promise.all(Array.from({ length: workers }, (_, w) => worker(w)));
  res.seconds = Math.min(Date.now() - start, durationMs) / 1000;
  res.seq_end = seqNext;
  if (latencies.length > 0) {
    latencies.sort((a, b) => a - b);
    res.latency_ms = {
      p50: latencies[Math.floor(latencies.length / 2)],
      p99: latencies[Math.floor(latencies.length * 99 / 100)],
      max: latencies[latencies.length - 1],
    };
  }
  try {
    await exporter.shutdown();
  } catch (e) {
    count(logs, 'shutdown: ' + String(e));
  }
  res.errors = Object.fromEntries(errors);
  res.logs = Object.fromEntries(logs);
  fs.writeFileSync(opt.result, JSON.stringify(res, null, 2));
}

main().then(() => process.exit(0), (e) => {
  console.error('client.js:', e);
  process.exit(1);
});
