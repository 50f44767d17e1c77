// contains-js: passes an output whose text contains `needle` — a poimen
// verifier written in JavaScript (world `verifier`).
//
// `verify(input, output, config)` gets JSON text of the step's input and
// output and of the verifier's configuration, and returns `{ pass, score,
// reason }`. A configuration it cannot use throws `{ tag: "invalid-input",
// val }`.

const CONFIG_SCHEMA = {
  type: "object",
  required: ["needle"],
  properties: { needle: { type: "string" } },
};

export function describe() {
  return {
    name: "contains-js",
    version: "0.1.0",
    description: "Passes an output that contains `needle` (JavaScript)",
    inputSchema: JSON.stringify(CONFIG_SCHEMA),
    outputSchema: "{}",
    capabilities: [],
    effect: "pure",
  };
}

export function verify(input, output, config) {
  const { needle } = JSON.parse(config);
  if (typeof needle !== "string") {
    throw { tag: "invalid-input", val: "`needle` must be a string" };
  }
  const text = JSON.stringify(JSON.parse(output));
  const pass = text.includes(needle);
  return {
    pass,
    score: pass ? 1 : 0,
    reason: pass ? `contains ${JSON.stringify(needle)}` : `no ${JSON.stringify(needle)} in ${text}`,
  };
}
