// schemas.d.ts is what scripts/gen-types.mjs makes of schemas/: a schema
// changed without regenerating the types fails here (and in make test).
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { generate } from "../scripts/gen-types.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const schemas = join(here, "..", "..", "..", "schemas");

test("the checked-in types are what the schemas give", { skip: !existsSync(schemas) && "no schemas/ (not in the agentscope repository)" }, () => {
  const checkedIn = readFileSync(join(here, "..", "schemas.d.ts"), "utf8");
  assert.equal(checkedIn, generate(schemas), "run: node clients/node/scripts/gen-types.mjs");
});

test("every shape and every event kind has its type", { skip: !existsSync(schemas) && "no schemas/" }, () => {
  const text = generate(schemas);
  for (const shape of ["Agent", "Event", "Report", "Launched", "Stop", "ErrorBody", "Health"]) {
    assert.match(text, new RegExp(`^export type ${shape} = `, "m"), shape);
  }
  assert.match(text, /^  oom_kill: OomKillDetail;$/m);
  assert.match(text, /^  guard_kill: GuardKillDetail;$/m);
  // A required field is required, an optional one optional, a null allowed where the schema allows it.
  assert.match(text, /export type Agent = \{[^}]*\n  memory_current: \(number \| null\);/s);
  assert.match(text, /export type Agent = \{[^}]*\n  leftovers\?: \(number \| null\);/s);
});
