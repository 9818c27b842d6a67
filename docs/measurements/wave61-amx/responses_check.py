"""The Responses API on the shipped pair, through a running `calispec up`, as the official `openai` client calls it.

Usage: python docs/measurements/wave61-amx/responses_check.py HTTP_PORT  (the key: $CALISPEC_TOKEN)
Prints, per request: the mode, the Response's status, usage and output items; for the stream, its event types in order.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

import openai

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather of a city", "parameters": WEATHER}]
ANSWER = {"type": "object", "properties": {"prime": {"type": "boolean"}, "reason": {"type": "string"}}}


def show(label: str, response: openai.types.responses.Response, seconds: float) -> None:
    usage = response.usage
    assert usage is not None
    print(f"== {label}: {response.status}, {usage.input_tokens} in / {usage.output_tokens} out, {seconds:.1f} s")
    for item in response.output:
        if item.type == "message":
            print(f"   message: {item.content[0].text!r}")  # type: ignore[union-attr]
        else:
            print(f"   {item.type}: {item.name}({item.arguments})")  # type: ignore[union-attr]


def main(port: int) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=os.environ["CALISPEC_TOKEN"], timeout=600)
    model = client.models.list().data[0].id
    asked = {"model": model, "temperature": 0, "max_output_tokens": 160}
    for mode in ("ar", "sd", "csd"):
        start = time.perf_counter()
        done = client.responses.create(
            **asked, instructions="Reply with only the code.", input="Write is_prime(n) in Python.",
            extra_body={"mode": mode},
        )  # fmt: skip
        show(f"text, {mode}", done, time.perf_counter() - start)
    start = time.perf_counter()
    events = list(client.responses.create(**asked, input="Write fib(n) in Python.", stream=True))
    kinds = Counter(e.type for e in events)
    print(f"== stream (csd): {len(events)} events in {time.perf_counter() - start:.1f} s: {dict(kinds)}")
    print(f"   last: {events[-1].type}, text {events[-1].response.output_text!r}")  # type: ignore[union-attr]
    start = time.perf_counter()
    call = client.responses.create(
        **asked, input="What is the weather in Paris?", tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "name": "get_weather"},
    )  # fmt: skip
    show("forced call", call, time.perf_counter() - start)
    start = time.perf_counter()
    form = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}
    typed = client.responses.create(**asked, input="Is 97 prime? Answer in JSON.", text=form)  # type: ignore[arg-type]
    show("json_schema", typed, time.perf_counter() - start)
    print("   parses:", json.loads(typed.output_text))


if __name__ == "__main__":
    main(int(sys.argv[1]))
