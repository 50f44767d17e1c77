"""max-words-py: passes an output whose text has at most `max` words — a
poimen verifier written in Python (world `verifier`).

`verify(input, output, config)` gets JSON text of the step's input and
output and of the verifier's configuration, and returns a `Verdict` (pass,
score in 0..=1, reason). A configuration it cannot use raises
`Err(ToolError_InvalidInput(...))`.
"""

import json

from componentize_py_types import Err
from wit_world import WitWorld as Verifier
from wit_world.imports.types import (
    Descriptor,
    EffectClass,
    ToolError_InvalidInput,
    Verdict,
)

CONFIG_SCHEMA = {
    "type": "object",
    "required": ["max"],
    "properties": {"max": {"type": "integer", "minimum": 0}},
}


def words(value) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return sum(words(v) for v in value.values())
    if isinstance(value, list):
        return sum(words(v) for v in value)
    return 0


class WitWorld(Verifier):
    def describe(self) -> Descriptor:
        return Descriptor(
            name="max-words-py",
            version="0.1.0",
            description="Passes an output of at most `max` words (Python)",
            input_schema=json.dumps(CONFIG_SCHEMA),
            output_schema="{}",
            capabilities=[],
            effect=EffectClass.PURE,
        )

    def verify(self, input: str, output: str, config: str) -> Verdict:
        limit = json.loads(config).get("max")
        if not isinstance(limit, int) or limit < 0:
            raise Err(ToolError_InvalidInput("`max` must be a non-negative integer"))
        n = words(json.loads(output))
        if n <= limit:
            return Verdict(pass_=True, score=1.0, reason=f"{n} words, at most {limit}")
        return Verdict(pass_=False, score=limit / n, reason=f"{n} words, more than {limit}")
