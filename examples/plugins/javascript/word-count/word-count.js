// word-count-js: counts the words of a text — a poimen tool written in
// JavaScript, built with componentize-js against poimen's WIT
// (`wit/plugin.wit`, world `tool`); see `examples/plugins/build.sh` and
// docs/writing-a-plugin.md.
//
// - `describe()` returns the descriptor (record fields in camelCase).
// - `invoke(args, idempotencyKey)` returns the result as JSON text. A WIT
//   `result` error is thrown as `{ tag, val }`: `{ tag: "invalid-input", val:
//   "why" }` is reported as invalid input (never retried). Any other throw is
//   a bug in the tool: the host shows the error and its stack, as it shows a
//   Rust panic.
// - `console.log()` / `console.error()` go to the call's recorded stderr.

const INPUT_SCHEMA = {
  type: "object",
  required: ["text"],
  properties: {
    text: { type: "string" },
    fail: { type: "boolean", description: "throw an error (for tests)" },
  },
};

const OUTPUT_SCHEMA = {
  type: "object",
  required: ["words"],
  properties: { words: { type: "integer", minimum: 0 } },
};

export function describe() {
  return {
    name: "word-count-js",
    version: "0.1.0",
    description: "Counts the words of a text (JavaScript)",
    inputSchema: JSON.stringify(INPUT_SCHEMA),
    outputSchema: JSON.stringify(OUTPUT_SCHEMA),
    capabilities: [],
    effect: "pure",
  };
}

export function invoke(args, idempotencyKey) {
  const value = JSON.parse(args);
  if (typeof value.text !== "string") {
    throw { tag: "invalid-input", val: "`text` must be a string" };
  }
  console.log(`counting the words of ${value.text.length} characters`);
  if (value.fail) {
    throw new Error(`asked to fail on ${JSON.stringify(value.text)}`);
  }
  const words = value.text.split(/\s+/).filter((w) => w.length > 0).length;
  return JSON.stringify({ words });
}
