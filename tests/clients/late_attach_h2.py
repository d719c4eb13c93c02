"""HTTP/2 streams already running when the recording starts, then new ones.

Opens one HTTP/2 connection (httpx + h2), starts `early` streaming chat completions
on it (with none: one short completion, finished, so the connection is idle), prints
EARLY-STREAMING once every one of them has its first token, then waits
for a line on stdin (the recording has started) and sends `late` completions on the
same connection, with a path the connection has not used before. Prints one JSON
line: the token counts (choice chunks) of the late requests and the early ones.
argv: base_url early late
"""
import asyncio
import json
import sys

import httpx

base, early, late = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
HEADERS = {"authorization": "Bearer SECRET-late-auth", "content-type": "application/json"}


async def stream(client, path, body, started=None):
    tokens = 0
    async with client.stream("POST", base + path, headers=HEADERS, json=body) as r:
        assert r.http_version == "HTTP/2", r.http_version
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if json.loads(line[6:]).get("choices"):
                tokens += 1
                if tokens == 1 and started is not None:
                    started.release()
    return tokens


async def main():
    async with httpx.AsyncClient(http2=True, verify=False, timeout=120) as client:
        started = asyncio.Semaphore(0)
        chat = {"model": "lab-model", "stream": True, "max_tokens": 300,
                "messages": [{"role": "user", "content": "SECRET-early-prompt"}]}
        early_tasks = [asyncio.create_task(stream(client, "/v1/chat/completions", chat, started))
                       for _ in range(early)]
        for _ in range(early):
            await started.acquire()
        if early == 0:
            await stream(client, "/v1/chat/completions", dict(chat, max_tokens=4))
        print("EARLY-STREAMING", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        completion = {"model": "lab-model", "stream": True, "max_tokens": 8,
                      "prompt": "SECRET-late-prompt"}
        late_counts = await asyncio.gather(
            *[stream(client, "/v1/completions", completion) for _ in range(late)])
        early_counts = await asyncio.gather(*early_tasks)
    print(json.dumps({"late": late_counts, "early": early_counts}), flush=True)


asyncio.run(main())
