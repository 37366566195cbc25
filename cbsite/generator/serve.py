"""`cbsite serve`: a static HTTP server for a built or published site.

The site needs HTTP, not file://: pages fetch their JSON data, Material's version selector reads
`../versions.json`, and Perfetto's handshake needs an origin.
"""

from __future__ import annotations

import functools
import http.server
from pathlib import Path

from cbsite.errors import CbsiteError


class _Handler(http.server.SimpleHTTPRequestHandler):
    # Traces are served as the gzip files they are (no Content-Encoding), which is what Perfetto reads.
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".gz": "application/gzip",
                      ".json": "application/json", ".parquet": "application/octet-stream"}

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: one line per request would drown the URL we print


def make_server(directory: Path, host: str = "127.0.0.1", port: int = 8000) -> http.server.ThreadingHTTPServer:
    directory = Path(directory)
    if not directory.is_dir():
        raise CbsiteError(f"{directory} is not a folder; build the site first (cbsite build)")
    handler = functools.partial(_Handler, directory=str(directory))
    try:
        return http.server.ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        raise CbsiteError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port") from exc


def serve(directory: Path, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve `directory` until interrupted."""
    server = make_server(directory, host, port)
    print(f"Serving {directory} at http://{host}:{server.server_address[1]}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
