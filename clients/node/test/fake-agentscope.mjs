#!/usr/bin/env node
// A stand-in for the agentscope CLI: answers each command with the real
// CLI's recorded --json output (fixtures/, made by `python -m tests.node_face
// record`) and logs its argv to $FAKE_AGENTSCOPE_LOG, one JSON line a call.
import { appendFileSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const fixtures = join(dirname(fileURLToPath(import.meta.url)), "fixtures");
const argv = process.argv.slice(2);
if (process.env.FAKE_AGENTSCOPE_LOG) appendFileSync(process.env.FAKE_AGENTSCOPE_LOG, JSON.stringify(argv) + "\n");
const fixture = (name) => readFileSync(join(fixtures, name), "utf8");
const command = argv.find((a) => !a.startsWith("-") && !["default", "user", "system"].includes(a) && argv[argv.indexOf(a) - 1] !== "--fleet");

if (command === "stop" && argv.includes("nosuch")) {
  process.stderr.write(fixture("error-not-found.json"));
  process.exit(3);
}
const answers = { run: "run.json", ls: "ls.json", report: "report.json", stop: "stop.json", events: "events.jsonl" };
if (!(command in answers)) {
  process.stderr.write(JSON.stringify({ schema: "agentscope.error/1", error: `no fixture for ${command}`, kind: "usage" }) + "\n");
  process.exit(2);
}
if (command === "events" && argv.includes("--follow")) {
  // As events --follow: the history (unless --limit 0), then one new event, then it waits.
  const events = fixture("events.jsonl").trim().split("\n");
  if (!argv.includes("--limit")) process.stdout.write(events.join("\n") + "\n");
  const last = JSON.parse(events[events.length - 1]);
  setTimeout(() => process.stdout.write(JSON.stringify({ ...last, id: last.id + 1, kind: "thawed", detail: { unit: last.detail.unit } }) + "\n"), 200);
  setInterval(() => {}, 1000);
} else {
  process.stdout.write(fixture(answers[command]));
}
