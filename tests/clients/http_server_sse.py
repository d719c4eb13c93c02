"""Python's own http.server streaming OpenAI chat chunks as many small Python servers
do: the response head in one write, then one write per event, TCP_NODELAY unset unless
asked; and http.client reading N keep-alive streams at once, each timing its own TTFT.
`writev` and `sendmsg` (TCP_NODELAY set) write each event in five pieces through that
call, as servers that gather their buffers do.

usage: http_server_sse.py serve PORT nagle|nodelay|writev|sendmsg
       http_server_sse.py client PORT STREAMS ROUNDS   (prints the TTFTs in ms, JSON)"""
import http.client
import http.server
import json
import os
import socket
import sys
import threading
import time

TOKENS = 16


def serve(port, mode):
    nodelay = mode != "nagle"

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()
            if nodelay:
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(TOKENS):
                time.sleep(0.002)
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                         "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}
                data = json.dumps(chunk).encode()
                size = len(data) + len("data: \n\n")
                parts = [b"%x\r\n" % size, b"data: ", data, b"\n\n", b"\r\n"]
                if mode == "writev":
                    os.writev(self.connection.fileno(), parts)
                elif mode == "sendmsg":
                    self.connection.sendmsg(parts)
                else:
                    self.wfile.write(b"".join(parts))
            done = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("serving", flush=True)
    server.serve_forever()


def client(port, streams, rounds):
    ttfts = []

    def one():
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for _ in range(rounds):
            body = json.dumps({"model": "m", "stream": True,
                               "messages": [{"role": "user", "content": "hi"}]})
            start = time.monotonic()
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            first = None
            while True:
                line = response.readline()
                if not line or line.startswith(b"data: [DONE]"):
                    break
                if first is None and line.startswith(b"data: {"):
                    first = time.monotonic()
            response.read()
            ttfts.append((first - start) * 1e3)

    threads = [threading.Thread(target=one) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(sorted(ttfts)))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), sys.argv[3])
    else:
        client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
