"""The official openai SDK over httpx with HTTP/2: the Responses API
(`client.responses.create(stream=True)`) and Chat Completions with two choices
(`client.chat.completions.create(n=2, stream=True)`), alternating.

Prints one JSON line: per request, which call it was, the client's own
CLOCK_MONOTONIC time (ns) of the call, and per token event (Responses: text,
reasoning and tool-call deltas; chat: chunks that carry a choice) the socket read
that delivered it (`token_ns`: the last TLS socket read that returned before the SDK
handed the event over, as the lab's bench times its events) and its choice index.
argv: base_url api_key requests max_tokens
"""
import json
import sys
import time

import httpx
import openai

import timed_tls

DELTAS = {
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
}

base_url, api_key, requests, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
http = httpx.Client(http2=True, verify=False)
client = openai.OpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)
out = []
for i in range(requests):
    start = time.monotonic_ns()
    tokens, choices = [], []
    if i % 2 == 0:
        kind = "responses"
        stream = client.responses.create(
            model="lab-model",
            input=f"SECRET-sdk-prompt-{i} tell me a story",
            stream=True,
            max_output_tokens=max_tokens,
        )
        for event in stream:
            if event.type in DELTAS:
                tokens.append(timed_tls.last_read_ns)
                choices.append(0)
    else:
        kind = "chat-n2"
        stream = client.chat.completions.create(
            model="lab-model",
            messages=[{"role": "user", "content": f"SECRET-sdk-prompt-{i} tell me a story"}],
            stream=True,
            n=2,
            max_tokens=max_tokens,
        )
        for chunk in stream:
            if chunk.choices:
                tokens.append(timed_tls.last_read_ns)
                choices.append(chunk.choices[0].index)
    out.append({"call": kind, "start_ns": start, "token_ns": tokens, "choice": choices})
print(json.dumps(out))
