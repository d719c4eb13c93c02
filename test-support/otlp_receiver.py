"""An OTLP/HTTP trace receiver for tokenscope's tests: decodes every POST with the
official opentelemetry-proto schema (not tokenscope's own messages, so a wrong field
number or type shows) and appends one JSON line per span to OUT; every body as received
is appended to OUT.raw too, for byte-level checks (no secret anywhere in what was sent).

usage: otlp_receiver.py PORT OUT     (PORT 0: any free port)
Prints "listening PORT" once bound; answers 200 with an empty ExportTraceServiceResponse,
400 to a body that does not decode.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value",):
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def span_line(resource, scope, s):
    return {
        "resource": resource,
        "scope": scope,
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent_span_id": s.parent_span_id.hex(),
        "trace_state": s.trace_state,
        "flags": s.flags,
        "name": s.name,
        "kind": s.kind,
        "start_time_unix_nano": s.start_time_unix_nano,
        "end_time_unix_nano": s.end_time_unix_nano,
        "attributes": attributes(s.attributes),
        "events": [
            {
                "name": e.name,
                "time_unix_nano": e.time_unix_nano,
                "attributes": attributes(e.attributes),
            }
            for e in s.events
        ],
        "status": {"code": s.status.code, "message": s.status.message},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    out = None

    def answer(self, status, body=b"", content_type="application/x-protobuf"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as e:  # a body that does not decode: the exporter's bug
            self.answer(400, str(e).encode(), "text/plain")
            return
        lines = []
        for rs in request.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                scope = {"name": ss.scope.name, "version": ss.scope.version}
                for s in ss.spans:
                    line = span_line(resource, scope, s)
                    line["path"] = self.path
                    line["content_type"] = self.headers.get("Content-Type")
                    lines.append(json.dumps(line))
        with LOCK:
            with open(self.out + ".raw", "ab") as raw:
                raw.write(body)
            with open(self.out, "a") as f:
                for line in lines:
                    f.write(line + "\n")
        self.answer(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def log_message(self, *args):
        pass


def main():
    port, out = int(sys.argv[1]), sys.argv[2]
    Handler.out = out
    open(out, "a").close()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
