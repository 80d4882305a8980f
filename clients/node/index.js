// agentscope-systemd: agentscope for a Node harness, over the CLI's --json
// and the monitor's read API. Node's standard library only.
//
// The shapes are agentscope's JSON contract (docs/json.md); their types are
// in schemas.d.ts, generated from the schemas. Launching and stopping go
// through the CLI (`agentscope run`, `stop`); reading the fleet goes through
// the monitor's read API where one listens (`monitor --listen`), else the CLI.

import { spawn } from "node:child_process";
import { request } from "node:http";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

/** exec's own exit codes (those of coreutils env(1) and docker run); any other is the command's. */
export const EXEC_EXIT = Object.freeze({ FAILED: 125, CANNOT_RUN: 126, NOT_FOUND: 127 });

/** A failure agentscope reported: `kind` is the contract's error kind (docs/json.md). */
export class AgentscopeError extends Error {
  constructor(message, { kind = "error", status = null, exitCode = null, body = null } = {}) {
    super(message);
    this.name = "AgentscopeError";
    this.kind = kind;
    this.status = status;
    this.exitCode = exitCode;
    this.body = body;
  }
}

function globalArgs({ fleet, manager } = {}) {
  const args = [];
  if (fleet !== undefined) args.push("--fleet", String(fleet));
  if (manager !== undefined) args.push("--manager", String(manager));
  return args;
}

// The options run and exec share, as the CLI spells them (docs/cli.md).
function scopeArgs(options) {
  const args = [];
  const add = (flag, value) => {
    if (value !== undefined && value !== null) args.push(flag, String(value));
  };
  add("--memory-max", options.memoryMax);
  add("--tasks-max", options.tasksMax);
  add("--cpu-weight", options.cpuWeight);
  add("--io-weight", options.ioWeight);
  for (const [key, value] of Object.entries(options.properties ?? {})) {
    args.push("--property", `${key}=${value}`);
  }
  add("--reap-after", options.reapAfter);
  return args;
}

function checkCommand(name, command) {
  if (typeof name !== "string" || name === "") throw new TypeError("name: a non-empty string");
  if (!Array.isArray(command) || command.length === 0 || !command.every((a) => typeof a === "string")) {
    throw new TypeError("command: a non-empty array of strings");
  }
}

/**
 * The argv that runs `command` as agent `name` in a scope of its own: prefix
 * a spawn with it. The command keeps its PID, stdio and signals; exec's own
 * failures exit 125/126/127 (EXEC_EXIT), with a JSON error line on stderr.
 */
export function execArgv(name, command, options = {}) {
  checkCommand(name, command);
  const argv = [options.bin ?? "agentscope", ...globalArgs(options)];
  if (options.json ?? true) argv.push("--json");
  argv.push("exec", ...scopeArgs(options));
  if (options.quiet) argv.push("--quiet");
  if (options.fallback !== undefined) argv.push("--fallback", String(options.fallback));
  argv.push(name, "--", ...command);
  return argv;
}

/** JSON Lines (events --json, GET /v1/events) as an array. */
export function parseJsonLines(text) {
  return text
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line));
}

function errorOf(text, fallback) {
  // The CLI's --json error is the last line of its stderr.
  const lines = text.trim().split("\n");
  try {
    const body = JSON.parse(lines[lines.length - 1]);
    if (body && typeof body.error === "string") return body;
  } catch {
    // not JSON: said below as it is
  }
  return { error: text.trim() || fallback, kind: "error" };
}

function parseMonitor(monitor) {
  if (monitor.startsWith("unix:")) return { socketPath: monitor.slice("unix:".length) };
  const url = new URL(monitor);
  if (url.protocol !== "http:") throw new TypeError(`monitor: http://HOST:PORT or unix:PATH, not ${monitor}`);
  return { host: url.hostname.replace(/^\[|\]$/g, ""), port: Number(url.port || 80) };
}

/** The monitor's read API (GET /v1/...): over HTTP on loopback, or its Unix socket. */
export class ReadApi {
  /** @param {string} monitor `http://127.0.0.1:9464` or `unix:/run/agentscope/monitor.sock` */
  constructor(monitor, { timeoutMs = 30_000 } = {}) {
    this.target = parseMonitor(monitor);
    this.timeoutMs = timeoutMs;
  }

  /** GET `path`; the body, or an AgentscopeError with the API's error kind and HTTP status. */
  get(path, { timeoutMs = this.timeoutMs, signal } = {}) {
    return new Promise((resolve, reject) => {
      const req = request(
        { ...this.target, path, method: "GET", headers: { Accept: "application/json" }, signal },
        (res) => {
          const chunks = [];
          res.on("data", (c) => chunks.push(c));
          res.on("error", reject);
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString("utf8");
            if (res.statusCode === 200) {
              resolve({ text, type: res.headers["content-type"] ?? "" });
              return;
            }
            const body = errorOf(text, `HTTP ${res.statusCode}`);
            reject(
              new AgentscopeError(body.error, {
                kind: body.kind,
                status: res.statusCode,
                body,
              }),
            );
          });
        },
      );
      req.setTimeout(timeoutMs, () => req.destroy(new AgentscopeError(`no answer from the monitor in ${timeoutMs} ms`, { kind: "timeout" })));
      req.on("error", (err) =>
        reject(err instanceof AgentscopeError || err.name === "AbortError" ? err : new AgentscopeError(`cannot reach the monitor: ${err.message}`, { kind: "unreachable" })),
      );
      req.end();
    });
  }

  async json(path, options) {
    return JSON.parse((await this.get(path, options)).text);
  }

  agents() {
    return this.json("/v1/agents");
  }

  agent(name) {
    return this.json(`/v1/agents/${encodeURIComponent(name)}`);
  }

  report() {
    return this.json("/v1/report");
  }

  health() {
    return this.get("/health").then((r) => JSON.parse(r.text)).catch((err) => {
      if (err.status === 503 && err.body) return err.body; // starting, stale, error: still a health body
      throw err;
    });
  }

  /** One page of events: `after` (id), `limit`, `agent`, `kind`, `wait` (seconds, a long poll). */
  async events({ after, limit, agent, kind, wait, signal } = {}) {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries({ after, limit, agent, kind, wait })) {
      if (value !== undefined && value !== null) query.set(key, String(value));
    }
    const qs = query.toString();
    const timeoutMs = Math.max(this.timeoutMs, (Number(wait ?? 0) + 10) * 1000);
    const { text } = await this.get(`/v1/events${qs ? `?${qs}` : ""}`, { timeoutMs, signal });
    return parseJsonLines(text);
  }
}

/**
 * A fleet, as a harness drives it: launch and stop through the CLI, read
 * through the monitor's read API when `monitor` is given, else the CLI.
 */
export class Agentscope {
  constructor({ bin = "agentscope", fleet, manager, monitor, env, timeoutMs = 60_000 } = {}) {
    this.bin = bin;
    this.fleet = fleet;
    this.manager = manager;
    this.env = env;
    this.timeoutMs = timeoutMs;
    this.api = monitor ? new ReadApi(monitor) : null;
  }

  /** execArgv() with this fleet's bin, fleet and manager. */
  execArgv(name, command, options = {}) {
    return execArgv(name, command, { bin: this.bin, fleet: this.fleet, manager: this.manager, ...options });
  }

  /** Run the CLI with --json; its stdout, or an AgentscopeError from its error line. */
  cli(args) {
    const argv = [...globalArgs(this), "--json", ...args];
    return new Promise((resolve, reject) => {
      const child = spawn(this.bin, argv, { stdio: ["ignore", "pipe", "pipe"], env: this.env ?? process.env });
      // Not spawn's own `timeout`: its timer outlives a command that could not start.
      const timer = setTimeout(() => child.kill("SIGKILL"), this.timeoutMs);
      const out = [];
      const err = [];
      child.stdout.on("data", (c) => out.push(c));
      child.stderr.on("data", (c) => err.push(c));
      child.on("error", (e) => {
        clearTimeout(timer);
        reject(new AgentscopeError(`cannot run ${this.bin}: ${e.message}`, { kind: "cli_not_found" }));
      });
      child.on("close", (code, signal) => {
        clearTimeout(timer);
        const stdout = Buffer.concat(out).toString("utf8");
        if (code === 0) {
          resolve(stdout);
          return;
        }
        const body = errorOf(Buffer.concat(err).toString("utf8"), `${this.bin} ended by ${signal}`);
        reject(new AgentscopeError(body.error, { kind: body.kind, exitCode: code, body }));
      });
    });
  }

  async cliJson(args) {
    return JSON.parse(await this.cli(args));
  }

  /** `agentscope run`: the launched agent (unit, PID, log or tmux window). */
  launch(name, command, options = {}) {
    checkCommand(name, command);
    const args = ["run", ...scopeArgs(options)];
    if (options.cwd !== undefined) args.push("--cwd", String(options.cwd));
    for (const [key, value] of Object.entries(options.env ?? {})) args.push("--env", `${key}=${value}`);
    if (options.log !== undefined) args.push("--log", String(options.log));
    if (options.tmux) args.push("--tmux");
    args.push(name, "--", ...command);
    return this.cliJson(args);
  }

  /** `agentscope stop NAME`: SIGTERM, then SIGKILL after `timeout` seconds. */
  stop(name, { timeout } = {}) {
    const args = ["stop"];
    if (timeout !== undefined) args.push("--timeout", String(timeout));
    args.push(name);
    return this.cliJson(args);
  }

  /** `agentscope stop --all`. */
  stopAll({ timeout } = {}) {
    const args = ["stop", "--all"];
    if (timeout !== undefined) args.push("--timeout", String(timeout));
    return this.cliJson(args);
  }

  /** The fleet's agents (`ls --json`; GET /v1/agents). */
  agents() {
    return this.api ? this.api.agents() : this.cliJson(["ls"]);
  }

  /** One agent; an AgentscopeError of kind `not_found` when the fleet has none of that name. */
  async agent(name) {
    if (this.api) return this.api.agent(name);
    const found = (await this.agents()).findLast((a) => a.name === name);
    if (!found) {
      throw new AgentscopeError(`no agent '${name}' in fleet '${this.fleet ?? "default"}'`, { kind: "not_found" });
    }
    return found;
  }

  /** The memory report (`report --json`; GET /v1/report). */
  report() {
    return this.api ? this.api.report() : this.cliJson(["report"]);
  }

  /** One page of recorded events, oldest first: after `after` (the first `limit`), else the newest `limit`. */
  async events({ after, limit, agent, kind, wait } = {}) {
    if (this.api) return this.api.events({ after, limit, agent, kind, wait });
    const args = ["events", ...filterArgs({ agent, kind })];
    if (after === undefined && limit !== undefined) args.push("--limit", String(limit));
    let found = parseJsonLines(await this.cli(args));
    if (after !== undefined) found = found.filter((e) => e.id > after);
    return after !== undefined && limit !== undefined ? found.slice(0, limit) : found;
  }

  /**
   * Every event from now on (or after the id `after`), as they are recorded:
   * `for await (const event of fleet.follow()) ...`. Over the read API a long
   * poll (`wait` seconds each); over the CLI one `events --follow`. Ends when
   * `signal` aborts or the loop breaks.
   */
  follow({ after, agent, kind, wait = 30, signal } = {}) {
    return this.api
      ? followApi(this.api, { after, agent, kind, wait, signal })
      : followCli(this, { after, agent, kind, signal });
  }
}

function filterArgs({ agent, kind }) {
  const args = [];
  if (agent !== undefined) args.push("--agent", String(agent));
  if (kind !== undefined) args.push("--kind", String(kind));
  return args;
}

async function* followApi(api, { after, agent, kind, wait, signal }) {
  let cursor = after;
  if (cursor === undefined) {
    const newest = await api.events({ limit: 1, signal });
    cursor = newest.length ? newest[newest.length - 1].id : 0;
  }
  while (!signal?.aborted) {
    let page;
    try {
      page = await api.events({ after: cursor, agent, kind, wait, limit: 1000, signal });
    } catch (err) {
      if (signal?.aborted) return;
      if (err instanceof AgentscopeError && err.status === 429) {
        await sleep(1000, undefined, { signal }).catch(() => {}); // busy: Retry-After 1
        continue;
      }
      throw err;
    }
    for (const event of page) {
      cursor = event.id;
      yield event;
    }
  }
}

async function* followCli(fleet, { after, agent, kind, signal }) {
  // --limit 0: none of the history, then every new event; with `after`, the
  // history too, from which those up to `after` are dropped.
  const args = [...globalArgs(fleet), "--json", "events", "--follow", ...filterArgs({ agent, kind })];
  if (after === undefined) args.push("--limit", "0");
  const child = spawn(fleet.bin, args, { stdio: ["ignore", "pipe", "pipe"], env: fleet.env ?? process.env, signal });
  const err = [];
  child.stderr.on("data", (c) => err.push(c));
  const exited = new Promise((resolve) => child.on("close", (code) => resolve(code)));
  child.on("error", () => {}); // an abort, or a missing bin: said by `exited` below
  try {
    for await (const line of createInterface({ input: child.stdout })) {
      if (!line.trim()) continue;
      const event = JSON.parse(line);
      if (after === undefined || event.id > after) yield event;
    }
    const code = await exited;
    if (!signal?.aborted && code !== 0) {
      const body = errorOf(Buffer.concat(err).toString("utf8"), `${fleet.bin} events --follow ended`);
      throw new AgentscopeError(body.error, { kind: body.kind, exitCode: code, body });
    }
  } finally {
    if (child.exitCode === null) child.kill("SIGTERM");
  }
}
