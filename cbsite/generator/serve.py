"""`cbsite serve`: a static HTTP server for a built or published site.

The site needs HTTP, not file://: pages fetch their JSON data, Material's version selector reads
`../versions.json`, and Perfetto's handshake needs an origin. Like a static host, it serves the `.gz` copy the
build wrote beside a file (precompress.py) with `Content-Encoding: gzip` to a client that accepts it, and answers
a missing page with the site's own 404 page.
"""

from __future__ import annotations

import functools
import http.server
import io
import os
import urllib.parse
from http import HTTPStatus
from pathlib import Path
from typing import BinaryIO

from cbsite.errors import CbsiteError
from cbsite.generator import precompress


class _Handler(http.server.SimpleHTTPRequestHandler):
    # Traces are served as the gzip files they are (no Content-Encoding), which is what Perfetto reads.
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".gz": "application/gzip",
                      ".json": "application/json", ".parquet": "application/octet-stream"}

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: one line per request would drown the URL we print

    def send_head(self) -> BinaryIO | io.BytesIO | None:
        path = self.translate_path(self.path)
        if os.path.isdir(path) and self.path.split("?", 1)[0].split("#", 1)[0].endswith("/"):
            path = os.path.join(path, "index.html")
        packed = path + precompress.SUFFIX
        if (not path.endswith(precompress.SUFFIX) and os.path.isfile(path) and os.path.isfile(packed)
                and self._accepts_gzip()):
            f = open(packed, "rb")
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-type", self.guess_type(path))
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Vary", "Accept-Encoding")
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.end_headers()
            return f
        return super().send_head()

    def _accepts_gzip(self) -> bool:
        """Accept-Encoding names gzip (or `*`) with a weight above zero."""
        for item in self.headers.get("Accept-Encoding", "").lower().split(","):
            coding, _, params = item.partition(";")
            if coding.strip() in ("gzip", "*"):
                q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
                try:
                    return float(q) > 0
                except ValueError:
                    return False
        return False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        page = self._not_found_page() if code == HTTPStatus.NOT_FOUND else None
        if page is None:
            super().send_error(code, message, explain)
            return
        body = page.read_bytes()
        self.send_response(code, message)
        self.send_header("Content-Type", "text/html;charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _not_found_page(self) -> Path | None:
        """The site's 404.html (MkDocs writes one): that of the version folder the path is under in a published
        site, else the root's."""
        root = Path(self.directory)
        parts = [p for p in urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).split("/") if p]
        candidates = [root / parts[0] / "404.html"] if len(parts) > 1 and parts[0] not in (".", "..") else []
        for page in candidates + [root / "404.html"]:
            if page.is_file():
                return page
        return None


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
