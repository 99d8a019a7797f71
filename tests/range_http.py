"""A static file server with HTTP byte ranges (single ranges, as fsspec asks for), for the tests:
`python range_http.py DIRECTORY PORT`. Serves HEAD with Content-Length and Accept-Ranges.

Faults and a log a test asks for with files of its own in DIRECTORY: a GET of `F` answers 503
once while `F.503` exists (which it removes), and every GET is appended to `.requests` (the
path and the Range header, one line each) while that file exists."""

from __future__ import annotations

import os
import re
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RangeHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's connections are reused, as a real server's are

    def log_message(self, *args: object) -> None:
        pass

    def _file(self) -> Path | None:
        path = Path(self.translate_path(self.path))
        return path if path.is_file() else None

    def do_HEAD(self) -> None:  # noqa: N802
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        path = self._file()
        log = Path(".requests")
        if log.exists():
            with log.open("a") as f:
                f.write(f"{self.path} {self.headers.get('Range', '')}\n")
        if path is not None and path.with_name(path.name + ".503").exists():
            path.with_name(path.name + ".503").unlink()
            self.send_error(503)
            return
        if path is None:
            self.send_error(404)
            return
        size = path.stat().st_size
        start, end = 0, size - 1
        m = _RANGE.match(self.headers.get("Range", ""))
        if m and (m.group(1) or m.group(2)):
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start, end = max(0, size - int(m.group(2))), size - 1
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with open(path, "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)


def main() -> None:
    root, port = sys.argv[1], int(sys.argv[2])
    os.chdir(root)
    ThreadingHTTPServer.request_queue_size = 128  # (socketserver's 5 drops the SYNs of concurrent clients)
    ThreadingHTTPServer(("127.0.0.1", port), RangeHandler).serve_forever()


if __name__ == "__main__":
    main()
