"""A loopback HTTP proxy that injects faults a real server cannot produce on
demand: a response lost after the server answered, a 503 with Retry-After."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# fault(method, path, n) -> "drop" (forward, then close without answering),
# "503" (answer 503 with Retry-After: 1 without forwarding) or None.
Fault = Callable[[str, str, int], "str | None"]


class Proxy:
    def __init__(self, upstream: str, fault: Fault) -> None:
        u = urlsplit(upstream)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.fault = fault
        self.counts: dict[str, int] = {}
        self.forwarded: list[tuple[str, str, bytes]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                path = self.path.split("?")[0]
                with proxy.lock:
                    proxy.counts[path] = proxy.counts.get(path, 0) + 1
                    count = proxy.counts[path]
                action = proxy.fault(self.command, path, count)
                if action == "503":
                    msg = b'{"ok":false,"code":"internal","message":"injected"}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Retry-After", "1")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "transfer-encoding")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                with proxy.lock:
                    proxy.forwarded.append((self.command, path, body))
                if action == "drop":
                    # The server answered; the client never hears it.
                    conn.close()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = _handle
            do_POST = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Proxy:
        self.thread.start()
        return self

    def __exit__(self, *a: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
