// Types of the agentscope-systemd client (index.js). The JSON shapes are in
// schemas.d.ts, generated from agentscope's schemas/ (docs/json.md).

import type { Agent, ErrorBody, Event, Launched, Report, Stop } from "./schemas.js";

export * from "./schemas.js";

/** exec's own exit codes; any other is the command's own status. */
export declare const EXEC_EXIT: Readonly<{ FAILED: 125; CANNOT_RUN: 126; NOT_FOUND: 127 }>;

/** A failure agentscope reported; `kind` is the contract's error kind (docs/json.md). */
export declare class AgentscopeError extends Error {
  kind: string;
  /** The read API's HTTP status (400, 404, 429, 503, ...), or null. */
  status: number | null;
  /** The CLI's exit code (2 bad input, 3 no such agent, 4 no systemd, ...), or null. */
  exitCode: number | null;
  body: ErrorBody | null;
}

/** The options `run` and `exec` share (docs/cli.md). */
export interface ScopeOptions {
  /** SIZE (`2G`), a percentage of RAM (`50%`), or `infinity`. */
  memoryMax?: string | number;
  tasksMax?: number;
  cpuWeight?: number;
  ioWeight?: number;
  /** systemd properties of the scope: AllowedCPUs, CPUQuota, MemorySwapMax, ... */
  properties?: Record<string, string | number>;
  /** Seconds leftovers may run after the main process ends, or `keep`. */
  reapAfter?: number | string;
}

export interface FleetOptions {
  /** The agentscope command (default `agentscope`). */
  bin?: string;
  fleet?: string;
  manager?: "user" | "system";
}

export interface ExecOptions extends ScopeOptions, FleetOptions {
  /** `--json` (default true): exec's own failure is a JSON line on stderr. */
  json?: boolean;
  quiet?: boolean;
  /** `run`: where no scope can be made, run the command unconfined; `fail` (the default): exit 125. */
  fallback?: "run" | "fail";
}

/** The argv that runs `command` as agent `name` in its own scope: prefix a spawn with it. */
export declare function execArgv(name: string, command: string[], options?: ExecOptions): string[];

/** JSON Lines as an array. */
export declare function parseJsonLines(text: string): unknown[];

export interface EventQuery {
  /** Only events with a greater id (the first `limit` of them). */
  after?: number;
  /** At most this many (1-1000); without `after`, the newest ones. */
  limit?: number;
  agent?: string;
  kind?: string;
  /** Read API only: a long poll of at most this many seconds (0-60). */
  wait?: number;
}

export interface FollowOptions {
  /** Start after this id; default: from now on. */
  after?: number;
  agent?: string;
  kind?: string;
  /** Seconds each long poll waits (read API; default 30). */
  wait?: number;
  signal?: AbortSignal;
}

/** The monitor's read API (`agentscope monitor --listen`). */
export declare class ReadApi {
  /** `http://127.0.0.1:9464` or `unix:/run/agentscope/monitor.sock`. */
  constructor(monitor: string, options?: { timeoutMs?: number });
  agents(): Promise<Agent[]>;
  agent(name: string): Promise<Agent>;
  report(): Promise<Report>;
  health(): Promise<import("./schemas.js").Health>;
  events(query?: EventQuery & { signal?: AbortSignal }): Promise<Event[]>;
}

export interface LaunchOptions extends ScopeOptions {
  cwd?: string;
  env?: Record<string, string>;
  log?: string;
  tmux?: boolean;
}

/** A fleet: launch and stop through the CLI; read through the read API when `monitor` is given. */
export declare class Agentscope {
  constructor(options?: FleetOptions & { monitor?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number });
  readonly api: ReadApi | null;
  execArgv(name: string, command: string[], options?: ExecOptions): string[];
  launch(name: string, command: string[], options?: LaunchOptions): Promise<Launched>;
  stop(name: string, options?: { timeout?: number }): Promise<Stop>;
  stopAll(options?: { timeout?: number }): Promise<Stop>;
  agents(): Promise<Agent[]>;
  agent(name: string): Promise<Agent>;
  report(): Promise<Report>;
  events(query?: EventQuery): Promise<Event[]>;
  follow(options?: FollowOptions): AsyncIterableIterator<Event>;
}
