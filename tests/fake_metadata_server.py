"""A local stand-in for the Compute Engine metadata server: its maintenance-event endpoint
answers NONE until the test calls `announce()`; `instance/attributes/KEY` answers
`attributes[KEY]`, or 404 for a key the instance lacks (as the real server does for, say,
`accelerator-type` on a VM that is not a TPU VM). Requests without the `Metadata-Flavor:
Google` header are refused as the real one refuses them. `host` is what GCE_METADATA_IP takes."""

from __future__ import annotations

import http.server
import threading


class FakeMetadataServer:
    ATTRIBUTES = "/computeMetadata/v1/instance/attributes/"

    def __init__(self, attributes: dict[str, str] | None = None) -> None:
        self.event = "NONE"
        self.attributes = dict(attributes or {})
        self.requests = 0
        self.paths: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server interface
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                    return
                server.requests += 1
                server.paths.append(self.path)
                if self.path.startswith(server.ATTRIBUTES):
                    value = server.attributes.get(self.path[len(server.ATTRIBUTES) :])
                    if value is None:
                        self.send_error(404, "Not Found")
                        return
                    body = value.encode()
                else:
                    body = server.event.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self._httpd.server_address[1]}"
        self.url = f"http://{self.host}/computeMetadata/v1/instance/maintenance-event"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def announce(self, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        self.event = event

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeMetadataServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
