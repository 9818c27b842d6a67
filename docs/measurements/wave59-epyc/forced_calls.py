"""Forced tool calls on the shipped pair over the OpenAI API (wave 59): `calispec up --http-port 53105`, then
`CALISPEC_TOKEN=... python docs/measurements/wave59-epyc/forced_calls.py` -> forced-calls.txt."""

import json
import os
import time

import openai

c = openai.OpenAI(
    base_url="http://127.0.0.1:53105/v1", api_key=os.environ["CALISPEC_TOKEN"], max_retries=0, timeout=300
)
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]
msgs = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
    for mode in ("sd", "csd"):
        t = time.time()
        r = c.chat.completions.create(
            model="target",
            messages=msgs,
            tools=tools,
            tool_choice=choice,
            temperature=0,
            max_tokens=96,
            extra_body={"mode": mode},
        )
        m = r.choices[0]
        print(
            json.dumps(choice),
            mode,
            f"{time.time() - t:.1f}s",
            m.finish_reason,
            m.message.content,
            [(x.function.name, x.function.arguments) for x in m.message.tool_calls or []],
        )
