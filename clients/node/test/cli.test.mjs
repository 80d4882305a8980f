// The client over the CLI's --json: a stand-in CLI (fake-agentscope.mjs)
// answers with the real CLI's recorded outputs (fixtures/, checked against
// the schemas by tests/test_node_client.py).
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Agentscope, AgentscopeError, EXEC_EXIT, execArgv, parseJsonLines } from "../index.js";

const here = dirname(fileURLToPath(import.meta.url));
const bin = join(here, "fake-agentscope.mjs");
const fixture = (name) => readFileSync(join(here, "fixtures", name), "utf8");
let dir;
let log;

before(() => {
  dir = mkdtempSync(join(tmpdir(), "agentscope-node-"));
  log = join(dir, "argv.log");
});
after(() => rmSync(dir, { recursive: true, force: true }));

function fleet(options = {}) {
  return new Agentscope({ bin, fleet: "ci", manager: "user", env: { ...process.env, FAKE_AGENTSCOPE_LOG: log }, ...options });
}

function lastArgv() {
  const lines = readFileSync(log, "utf8").trim().split("\n");
  return JSON.parse(lines[lines.length - 1]);
}

test("execArgv prefixes a command with agentscope exec", () => {
  assert.deepEqual(execArgv("builder", ["claude", "--print", "hi"]), [
    "agentscope", "--json", "exec", "builder", "--", "claude", "--print", "hi",
  ]);
  assert.deepEqual(
    execArgv("b-1", ["node", "x.js"], { fleet: "ci", manager: "user", memoryMax: "2G", tasksMax: 64, fallback: "run", quiet: true, properties: { CPUQuota: "50%" } }),
    ["agentscope", "--fleet", "ci", "--manager", "user", "--json", "exec", "--memory-max", "2G", "--tasks-max", "64",
      "--property", "CPUQuota=50%", "--quiet", "--fallback", "run", "b-1", "--", "node", "x.js"],
  );
  // A command's own options come after --: never taken as exec's.
  assert.deepEqual(execArgv("a", ["--json"]).slice(-2), ["--", "--json"]);
  assert.throws(() => execArgv("a", []), TypeError);
  assert.deepEqual(EXEC_EXIT, { FAILED: 125, CANNOT_RUN: 126, NOT_FOUND: 127 });
});

test("launch runs agentscope run and returns the launched agent", async () => {
  const launched = await fleet().launch("b", ["sleep", "600"], { memoryMax: "1G", env: { K: "v" }, cwd: "/tmp" });
  assert.deepEqual(launched, JSON.parse(fixture("run.json")));
  assert.equal(launched.schema, "agentscope.launched/1");
  assert.deepEqual(lastArgv(), [
    "--fleet", "ci", "--manager", "user", "--json", "run", "--memory-max", "1G", "--cwd", "/tmp", "--env", "K=v", "b", "--", "sleep", "600",
  ]);
});

test("agents, agent and report read ls --json and report --json", async () => {
  const scope = fleet();
  const agents = await scope.agents();
  assert.deepEqual(agents, JSON.parse(fixture("ls.json")));
  assert.deepEqual(agents.map((a) => a.name), ["a", "b"]);
  assert.equal((await scope.agent("b")).unit, agents[1].unit);
  await assert.rejects(scope.agent("nosuch"), (err) => err instanceof AgentscopeError && err.kind === "not_found");
  const report = await scope.report();
  assert.equal(report.schema, "agentscope.report/1");
  assert.deepEqual(lastArgv().slice(-1), ["report"]);
});

test("a failure is an AgentscopeError with the CLI's kind and exit code", async () => {
  await assert.rejects(fleet().stop("nosuch"), (err) => {
    assert.ok(err instanceof AgentscopeError);
    assert.equal(err.kind, "not_found");
    assert.equal(err.exitCode, 3);
    assert.match(err.message, /no agent 'nosuch'/);
    return true;
  });
  assert.deepEqual((await fleet().stop("a", { timeout: 1 })), JSON.parse(fixture("stop.json")));
  assert.deepEqual(lastArgv().slice(-4), ["stop", "--timeout", "1", "a"]);
  await assert.rejects(fleet({ bin: join(dir, "no-such-agentscope") }).agents(), (err) => err.kind === "cli_not_found");
});

test("events pages like the read API: after an id, or the newest", async () => {
  const recorded = parseJsonLines(fixture("events.jsonl"));
  const scope = fleet();
  assert.deepEqual(await scope.events(), recorded);
  assert.deepEqual(await scope.events({ after: recorded[1].id, limit: 2 }), recorded.slice(2, 4));
  assert.deepEqual((await scope.events({ kind: "launched", limit: 3 })).length, recorded.length); // the stand-in does not filter
  assert.deepEqual(lastArgv().slice(-5), ["events", "--kind", "launched", "--limit", "3"]);
});

test("follow over the CLI yields new events as events --follow prints them", async () => {
  const recorded = parseJsonLines(fixture("events.jsonl"));
  const abort = new AbortController();
  const seen = [];
  for await (const event of fleet().follow({ signal: abort.signal })) {
    seen.push(event);
    abort.abort();
  }
  assert.deepEqual(seen.map((e) => [e.id, e.kind]), [[recorded.at(-1).id + 1, "thawed"]]);
  assert.deepEqual(lastArgv().slice(-4), ["events", "--follow", "--limit", "0"]);
  // From an id: the history after it, then what comes.
  const again = [];
  for await (const event of fleet().follow({ after: recorded.at(-2).id })) {
    again.push(event.id);
    if (again.length === 2) break;
  }
  assert.deepEqual(again, [recorded.at(-1).id, recorded.at(-1).id + 1]);
});
