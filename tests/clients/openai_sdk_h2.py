"""The official openai SDK over httpx with HTTP/2, streaming chat completions.

Prints one JSON line: per request, the client's own CLOCK_MONOTONIC times (ns) of
the call, of every chunk that carried a choice as the SDK handed it over
(`chunk_ns`), and of the socket read that delivered that chunk (`token_ns`: the last
TLS socket read that returned before the chunk was handed over, as the lab's bench
times its events), and the HTTP version httpx used.
argv: base_url api_key requests max_tokens
"""
import json
import sys
import time

import httpx
import openai

import timed_tls

base_url, api_key, requests, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
http = httpx.Client(http2=True, verify=False)
client = openai.OpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)
out = []
for i in range(requests):
    start = time.monotonic_ns()
    with client.chat.completions.with_streaming_response.create(
        model="lab-model",
        messages=[{"role": "user", "content": f"SECRET-sdk-prompt-{i} tell me a story"}],
        stream=True,
        max_tokens=max_tokens,
    ) as raw:
        version = raw.http_response.http_version
        tokens, handed = [], []
        for chunk in raw.parse():
            if chunk.choices:
                handed.append(time.monotonic_ns())
                tokens.append(timed_tls.last_read_ns)
    out.append({"start_ns": start, "token_ns": tokens, "chunk_ns": handed, "http_version": version})
print(json.dumps(out))
