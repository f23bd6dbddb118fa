"""A local stand-in for the Compute Engine metadata server's maintenance-event endpoint: it
answers NONE until the test calls `announce()`, and refuses requests without the
`Metadata-Flavor: Google` header as the real one does."""

from __future__ import annotations

import http.server
import threading


class FakeMetadataServer:
    def __init__(self) -> None:
        self.event = "NONE"
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server interface
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor:Google header")
                    return
                server.requests += 1
                body = server.event.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = (f"http://127.0.0.1:{self._httpd.server_address[1]}"
                    "/computeMetadata/v1/instance/maintenance-event")
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def announce(self, event: str = "TERMINATE_ON_HOST_MAINTENANCE") -> None:
        self.event = event

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "FakeMetadataServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
