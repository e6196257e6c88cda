// BullMQ side of e2e/bench.sh peers: setup | insert | work, flags as in ../common.mjs.
// --db is redis://HOST:PORT.
import { Queue, Worker } from "bullmq";
import { Redis } from "ioredis";
import { body, emit, finishedOrSignalled, flags, handler, timedInsert } from "../common.mjs";

const f = flags(process.argv.slice(2));
const url = new URL(f.db);
const connection = { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };

if (f.command === "setup") {
  const redis = new Redis(connection);
  await redis.flushdb();
  redis.disconnect();
  emit({ ok: true });
} else if (f.command === "insert") {
  const queue = new Queue("noop", { connection });
  const opts = (eta) => ({ delay: Math.max(0, eta - Date.now()) });
  await timedInsert(
    f,
    (eta) => queue.add("noop", body(eta), opts(eta)),
    (etas) => queue.addBulk(etas.map((eta) => ({ name: "noop", data: body(eta), opts: opts(eta) }))),
  );
  await queue.close();
} else if (f.command === "work") {
  const end = finishedOrSignalled();
  const h = handler(f, end.done);
  const worker = new Worker("noop", (job) => h.run(job.data), {
    connection,
    concurrency: f.concurrency,
    autorun: false,
  });
  worker.on("error", (e) => console.error(e));
  const started = Date.now();
  const running = worker.run();
  emit({ started_ms: started });
  await end.promise;
  emit(h.summary());
  await worker.close();
  await running;
} else {
  throw new Error(`unknown command ${f.command}`);
}
