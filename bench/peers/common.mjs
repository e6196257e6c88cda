// Shared by the Node peers (graphile/peer.mjs, bullmq/peer.mjs): the flags every peer
// command takes (the same as the River peer in driver/river.go), the HTTP call each
// handler makes to the no-op executor, and the JSON lines the driver reads.
import http from "node:http";
import { parseArgs } from "node:util";

export function flags(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      db: { type: "string", default: "" },
      count: { type: "string", default: "0" },
      mode: { type: "string", default: "batch" },
      concurrency: { type: "string", default: "64" },
      batch: { type: "string", default: "1000" },
      inflight: { type: "string", default: "4" },
      "delay-min-ms": { type: "string", default: "0" },
      "delay-max-ms": { type: "string", default: "0" },
      "eta-ms": { type: "string", default: "0" },
      handler: { type: "string", default: "http" },
      url: { type: "string", default: "" },
      expect: { type: "string", default: "0" },
      pool: { type: "string", default: "10" },
    },
  });
  const n = (k) => Number(values[k]);
  return {
    command: positionals[0],
    db: values.db,
    count: n("count"),
    mode: values.mode,
    concurrency: n("concurrency"),
    batch: n("batch"),
    inflight: n("inflight"),
    delayMin: n("delay-min-ms"),
    delayMax: n("delay-max-ms"),
    etaMs: n("eta-ms"),
    handler: values.handler,
    url: values.url,
    expect: n("expect"),
    pool: n("pool"),
  };
}

/** The i-th task's ETA in Unix ms: one ETA for all, or a uniform delay from now. */
export function etaFor(f, now) {
  if (f.etaMs > 0) return f.etaMs;
  const spread = f.delayMax > f.delayMin ? Math.floor(Math.random() * (f.delayMax - f.delayMin + 1)) : 0;
  return now + f.delayMin + spread;
}

export function body(etaMs) {
  return { eta: new Date(etaMs).toISOString(), payload: { n: 1 } };
}

export function emit(v) {
  process.stdout.write(JSON.stringify(v) + "\n");
}

/** Runs `op(i)` for i in 0..count with at most `inflight` at once. */
export async function pool(count, inflight, op) {
  let next = 0;
  const lane = async () => {
    while (next < count) {
      const i = next++;
      await op(i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(inflight, count) }, lane));
}

/** Times an insert: single inserts `concurrency` in flight, or batches `inflight` in flight. */
export async function timedInsert(f, single, many) {
  const start = performance.now();
  if (f.mode === "single") {
    await pool(f.count, f.concurrency, () => single(etaFor(f, Date.now())));
  } else {
    const batches = Math.ceil(f.count / f.batch);
    await pool(batches, f.inflight, (b) => {
      const n = Math.min(f.batch, f.count - b * f.batch);
      const now = Date.now();
      return many(Array.from({ length: n }, () => etaFor(f, now)));
    });
  }
  emit({ seconds: (performance.now() - start) / 1000 });
}

/** The handler: POST the task's body to the executor (keep-alive, `concurrency` sockets), or nothing. */
export function handler(f, done) {
  const late = [];
  const agent = new http.Agent({ keepAlive: true, maxSockets: f.concurrency });
  const url = new URL(f.url || "http://127.0.0.1/");
  const post = (data) =>
    new Promise((resolve, reject) => {
      const text = JSON.stringify(data);
      const req = http.request(
        {
          agent,
          host: url.hostname,
          port: url.port,
          path: url.pathname,
          method: "POST",
          headers: { "content-type": "application/json", "content-length": Buffer.byteLength(text) },
          timeout: 30000,
        },
        (res) => {
          res.resume();
          res.on("end", () => (res.statusCode === 200 ? resolve() : reject(new Error(`executor answered ${res.statusCode}`))));
        },
      );
      req.on("error", reject);
      req.end(text);
    });
  let count = 0;
  let first = 0;
  const finished = () => {
    count += 1;
    if (f.expect > 0 && count === f.expect) done();
  };
  const run = async (data) => {
    if (f.handler === "noop") {
      if (first === 0) first = Date.now();
      if (late.length < 4000000) late.push(Date.now() - Date.parse(data.eta));
      finished();
      return;
    }
    await post(data);
    finished();
  };
  const summary = () => {
    late.sort((a, b) => a - b);
    const pick = (q) => (late.length ? late[Math.min(late.length - 1, Math.floor(late.length * q))] : 0);
    return {
      first_ms: first,
      done_ms: Date.now(),
      count,
      p50: pick(0.5),
      p99: pick(0.99),
      max: late.length ? late[late.length - 1] : 0,
      early: late.filter((l) => l < 0).length,
    };
  };
  return { run, summary };
}

/** Resolves when `expect` tasks are done, or on SIGTERM/SIGINT. */
export function finishedOrSignalled() {
  let resolve;
  const p = new Promise((r) => (resolve = r));
  process.once("SIGTERM", () => resolve());
  process.once("SIGINT", () => resolve());
  return { promise: p, done: () => resolve() };
}
