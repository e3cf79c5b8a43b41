"""An OTLP/HTTP traces endpoint for tests/traces.rs: it decodes each export with the
OpenTelemetry project's own protobuf classes (opentelemetry-proto), not a decoder written here,
and appends one JSON object per span to the file named by its one argument. Prints the port it
listens on (127.0.0.1, a free one) as its first line, then serves until killed.
"""

import gzip
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SPANS = sys.argv[1]


def value(any_value):
    """An AnyValue as the JSON value it holds."""
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(415 if self.path == "/v1/traces" else 404)
            self.end_headers()
            return
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        with open(SPANS, "a", encoding="utf-8") as out:
            for resource_spans in export.resource_spans:
                resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        record = {
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": span.kind,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "status": span.status.code,
                            "attributes": {a.key: value(a.value) for a in span.attributes},
                            "resource": resource,
                        }
                        out.write(json.dumps(record) + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Receiver)
print(server.server_address[1], flush=True)
server.serve_forever()
