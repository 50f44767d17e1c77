"""word-count-py: counts the words of a text — a poimen tool written in Python.

Built with componentize-py against poimen's WIT (`wit/plugin.wit`, world
`tool`); see `examples/plugins/build.sh` and docs/writing-a-plugin.md.

- `describe` returns the descriptor: name, version, JSON Schemas, no
  capabilities, effect `pure`.
- `invoke` returns the result as JSON text. A bad argument raises
  `Err(ToolError_InvalidInput(...))` — the WIT `tool-error`, which the host
  reports as invalid input (never retried). Any other exception is a bug in
  the tool: the host shows its traceback, as it shows a Rust panic.
- `print()` goes to the call's recorded stderr.
"""

import json

from componentize_py_types import Err
from wit_world import WitWorld as Tool
from wit_world.imports.types import Descriptor, EffectClass, ToolError_InvalidInput

INPUT_SCHEMA = {
    "type": "object",
    "required": ["text"],
    "properties": {
        "text": {"type": "string"},
        "fail": {"type": "boolean", "description": "raise an exception (for tests)"},
    },
}

OUTPUT_SCHEMA = {
    "type": "object",
    "required": ["words"],
    "properties": {"words": {"type": "integer", "minimum": 0}},
}


class WitWorld(Tool):
    def describe(self) -> Descriptor:
        return Descriptor(
            name="word-count-py",
            version="0.1.0",
            description="Counts the words of a text (Python)",
            input_schema=json.dumps(INPUT_SCHEMA),
            output_schema=json.dumps(OUTPUT_SCHEMA),
            capabilities=[],
            effect=EffectClass.PURE,
        )

    def invoke(self, args: str, idempotency_key: str) -> str:
        value = json.loads(args)
        text = value.get("text")
        if not isinstance(text, str):
            raise Err(ToolError_InvalidInput("`text` must be a string"))
        print(f"counting the words of {len(text)} characters")
        if value.get("fail"):
            raise ValueError(f"asked to fail on {text!r}")
        return json.dumps({"words": len(text.split())})
