// A Node harness, as one adopting agentscope would write it (docs/node.md),
// run by test_node.py in the VM: it launches agents through the CLI (run,
// and exec as a spawn prefix), lists them and follows their events through
// both the monitor's read API and the CLI. Prints one JSON summary.
//
//   node node_harness.mjs CLIENT_DIR FLEET MONITOR   (MONITOR: unix:PATH or http://...)
import { spawn } from "node:child_process";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [clientDir, fleetName, monitor] = process.argv.slice(2);
const { Agentscope } = await import(pathToFileURL(join(clientDir, "index.js")).href);

const cli = new Agentscope({ fleet: fleetName });
const face = new Agentscope({ fleet: fleetName, monitor });
const out = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, check, seconds) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${seconds} s`);
    await sleep(500);
  }
}

async function collect(events, stopWhen, seconds) {
  const seen = [];
  const timer = setTimeout(() => events.return(), seconds * 1000);
  for await (const event of events) {
    seen.push(event);
    if (stopWhen(event)) break;
  }
  clearTimeout(timer);
  return seen;
}

const newest = (await face.events({ limit: 1 })).at(-1)?.id ?? 0;
out.launched = await cli.launch("a", ["sleep", "300"]);
const [bin, ...args] = cli.execArgv("b", ["sleep", "300"]);
const child = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"], detached: true });
let execErr = "";
child.stderr.on("data", (c) => (execErr += c));
out.execPid = child.pid;
out.faceAgents = await until(
  "a and b on the face",
  async () => {
    const agents = await face.agents();
    return ["a", "b"].every((n) => agents.some((a) => a.name === n && a.state === "running")) && agents;
  },
  120,
);
out.faceAgentB = await face.agent("b");
out.cliAgents = await cli.agents();
out.stopped = await cli.stop("a", { timeout: 5 });
const isStopA = (e) => e.kind === "stopped" && e.agent === "a";
out.faceEvents = await collect(face.follow({ after: newest, wait: 20 }), isStopA, 120);
out.cliEvents = await collect(cli.follow({ after: newest }), isStopA, 180);
out.report = await face.report();
child.kill("SIGTERM");
out.execStderr = execErr;
process.stdout.write(JSON.stringify(out) + "\n");
