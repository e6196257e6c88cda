// graphile-worker side of e2e/bench.sh peers: setup | insert | work, flags as in ../common.mjs.
import { Logger, makeWorkerUtils, run, runMigrations } from "graphile-worker";
import { body, emit, finishedOrSignalled, flags, handler, timedInsert } from "../common.mjs";

const f = flags(process.argv.slice(2));
// Errors only: the default logger writes a line per worker event.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});
const shared = { connectionString: f.db, maxPoolSize: f.pool, logger };

if (f.command === "setup") {
  await runMigrations(shared);
  emit({ ok: true });
} else if (f.command === "insert") {
  const utils = await makeWorkerUtils(shared);
  await timedInsert(
    f,
    (eta) => utils.addJob("noop", body(eta), { runAt: new Date(eta) }),
    (etas) => utils.addJobs(etas.map((eta) => ({ identifier: "noop", payload: body(eta), runAt: new Date(eta) }))),
  );
  await utils.release();
} else if (f.command === "work") {
  const end = finishedOrSignalled();
  const h = handler(f, end.done);
  const started = Date.now();
  const runner = await run({
    ...shared,
    concurrency: f.concurrency,
    noHandleSignals: true,
    taskList: { noop: (payload) => h.run(payload) },
  });
  emit({ started_ms: started });
  await end.promise;
  emit(h.summary());
  await runner.stop();
} else {
  throw new Error(`unknown command ${f.command}`);
}
