// The client over the real read API: the monitor's face (agentscope_systemd/_cli/_http.py),
// served by `python -m tests.node_face serve` over a real agentscope_systemd.Fleet on
// the repository's fake systemd manager, on loopback TCP and a Unix socket.
// Needs the repository and its Python (AGENTSCOPE_PYTHON, else .venv).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Agentscope, AgentscopeError, ReadApi } from "../index.js";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const python = process.env.AGENTSCOPE_PYTHON ?? join(repo, ".venv", "bin", "python");
const skip = (!existsSync(join(repo, "tests", "node_face.py")) || !existsSync(python)) &&
  "needs the agentscope repository and its Python (make venv, or AGENTSCOPE_PYTHON)";

let face;
let lines;
let served;

async function say(command) {
  face.stdin.write(`${command}\n`);
  const { value } = await lines.next();
  return JSON.parse(value);
}

before(async () => {
  if (skip) return;
  face = spawn(python, ["-m", "tests.node_face", "serve"], { cwd: repo, stdio: ["pipe", "pipe", "inherit"] });
  lines = createInterface({ input: face.stdout })[Symbol.asyncIterator]();
  const { value } = await lines.next();
  served = JSON.parse(value);
});

after(() => {
  if (face) {
    face.stdin.end();
    return new Promise((done) => face.on("close", done));
  }
});

test("agents and one agent over HTTP and over the Unix socket", { skip }, async () => {
  for (const monitor of [served.url, `unix:${served.socket}`]) {
    const fleet = new Agentscope({ monitor });
    const agents = await fleet.agents();
    assert.deepEqual(agents.map((a) => [a.schema, a.name, a.state]), [
      ["agentscope.agent/1", "a", "running"],
      ["agentscope.agent/1", "b", "running"],
    ], monitor);
    assert.deepEqual(await fleet.agent("b"), agents[1]);
    await assert.rejects(fleet.agent("nosuch"), (err) => err instanceof AgentscopeError && err.status === 404 && err.kind === "not_found");
  }
});

test("report and health", { skip }, async () => {
  const api = new ReadApi(served.url);
  const report = await api.report();
  assert.equal(report.schema, "agentscope.report/1");
  assert.deepEqual(report.agents.map((a) => a.agent).sort(), ["a", "b"]);
  const health = await api.health();
  assert.equal(health.schema, "agentscope.health/1");
  assert.equal(health.fleet, "default");
});

test("events page by id; a bad parameter is a 400 with the contract's error", { skip }, async () => {
  const fleet = new Agentscope({ monitor: served.url });
  const all = await fleet.events({ after: 0 });
  // b's MemorySwapMax is not enforced on the fake tree: properties_not_applied.
  assert.deepEqual(all.map((e) => [e.kind, e.agent]), [["launched", "a"], ["launched", "b"], ["properties_not_applied", "b"]]);
  assert.deepEqual(await fleet.events({ after: all[0].id }), all.slice(1));
  assert.deepEqual(await fleet.events({ limit: 1 }), all.slice(-1));
  await assert.rejects(fleet.events({ limit: 5000 }), (err) => {
    assert.equal(err.status, 400);
    assert.equal(err.kind, "invalid_config");
    assert.equal(err.body.schema, "agentscope.error/1");
    assert.match(err.message, /limit/);
    return true;
  });
});

test("follow yields an event as soon as it is recorded (a long poll)", { skip }, async () => {
  for (const monitor of [served.url, `unix:${served.socket}`]) {
    const fleet = new Agentscope({ monitor });
    const events = fleet.follow({ wait: 20 });
    const next = events.next();
    await new Promise((r) => setTimeout(r, 300));
    const t0 = Date.now();
    assert.equal((await say("kill b")).code, 0);
    const { value } = await next;
    assert.deepEqual([value.schema, value.kind, value.agent], ["agentscope.event/1", "signalled", "b"], monitor);
    assert.ok(Date.now() - t0 < 5000, `${Date.now() - t0} ms`);
    await events.return();
  }
});

test("follow ends when its signal aborts", { skip }, async () => {
  const abort = new AbortController();
  const fleet = new Agentscope({ monitor: served.url });
  setTimeout(() => abort.abort(), 300);
  const t0 = Date.now();
  const seen = [];
  for await (const event of fleet.follow({ wait: 30, signal: abort.signal })) seen.push(event);
  assert.deepEqual(seen, []);
  assert.ok(Date.now() - t0 < 5000);
});
