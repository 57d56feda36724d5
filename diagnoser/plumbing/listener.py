"""HTTP listeners that hold up against too many, slow or hostile clients: the webhook's
``/alerts`` and the probe's ``/metrics``.

Each bound is there because ``http.server`` has none of it by default:

- connections: at most ``max_connections`` are served at once, each by a thread; the next
  ones are not accepted until one ends, so they wait in the kernel's listen backlog
  (``BACKLOG``) instead of each taking a thread, its memory and a file descriptor (the
  diagnoses' own connections need descriptors too). When all are taken and a client waits,
  the oldest connection still without its request head, with nothing unread, and accepted
  ``EVICT_AFTER`` seconds ago at least, is closed to make room: a flood of connections that
  send nothing would otherwise hold every slot in turn for ``timeout`` seconds each and keep
  real requests waiting for minutes, where a real client has sent its request by the time
  its connection is accepted.
- time: ``timeout`` seconds for each read from a client (an idle connection is closed after
  that), and ``deadline`` seconds for a whole connection, however slowly it sends, after
  which its socket is shut down. So no client holds a connection slot long.
- the request head: at most ``MAX_HEAD`` bytes for the request line and headers together and
  ``MAX_HEADER_FIELDS`` header fields (``http.server`` reads 100 lines of 64 KiB each),
  answered 431 beyond that, 414 for a request line alone over it.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import select
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from diagnoser.plumbing.http import REAPER

log = logging.getLogger("servediag.listener")

BACKLOG = 1024  # connections waiting to be accepted (socketserver's default is 5)
MAX_CONNECTIONS = 64  # served at once
CLIENT_TIMEOUT = 10.0  # seconds for each read from a client: an idle connection ends
CLIENT_DEADLINE = 30.0  # seconds for a whole connection, however slowly the client sends
MAX_HEAD = 32 << 10  # bytes of request line and headers
MAX_HEADER_FIELDS = 64
SLOT_POLL = 0.05  # seconds between two looks for a free slot, while the server is full
EVICT_AFTER = 0.1  # seconds after its accept that a connection with no request head and
# nothing unread may be closed to make room for a new one


class _Head:
    """A client's stream that bounds the request head: its line and header fields count
    against ``MAX_HEAD`` bytes and ``MAX_HEADER_FIELDS`` fields, until the blank line that
    ends them; the body is read as it comes."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.next_request()

    def next_request(self) -> None:
        self.left = MAX_HEAD
        self.lines = 0
        self.in_head = True
        self.line_too_long = False

    def readline(self, limit: int = -1) -> bytes:
        if not self.in_head:
            return bytes(self.raw.readline(limit))
        most = self.left + 1 if limit < 0 else min(limit, self.left + 1)
        line = bytes(self.raw.readline(most))
        self.left -= len(line)
        self.lines += 1
        end = line in (b"\r\n", b"\n", b"")
        if self.lines == 1:  # the request line: ``parse_request`` answers 414
            self.line_too_long = self.left < 0
            return line
        if self.left < 0:
            raise http.client.LineTooLong(f"request head over {MAX_HEAD} bytes")
        if not end and self.lines - 1 > MAX_HEADER_FIELDS:
            raise http.client.HTTPException(f"more than {MAX_HEADER_FIELDS} header fields")
        self.in_head = not end
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class Handler(BaseHTTPRequestHandler):
    """A request handler with a per-read timeout, a deadline for the whole connection and a
    bounded request head. Subclasses set ``timeout`` and ``deadline`` to their own."""

    timeout = CLIENT_TIMEOUT
    deadline = CLIENT_DEADLINE

    def setup(self) -> None:
        super().setup()
        self._reaped = REAPER.watch(self.connection, time.monotonic() + self.deadline)
        self.rfile = _Head(self.rfile)  # type: ignore[assignment]

    def finish(self) -> None:
        REAPER.forget(self._reaped)
        with contextlib.suppress(OSError):  # the client went away, or its time ran out
            super().finish()

    def handle_one_request(self) -> None:
        if isinstance(self.rfile, _Head):  # a kept-alive connection's next request
            self.rfile.next_request()
        super().handle_one_request()

    def parse_request(self) -> bool:
        head = self.rfile
        if isinstance(head, _Head) and head.line_too_long:
            self.requestline, self.request_version, self.command = "", "", ""
            self.close_connection = True
            self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
            return False
        parsed = super().parse_request()
        if parsed and isinstance(self.server, Server):
            self.server.head_done(self.request)
        return parsed

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.client_address[0], format % args)


def _unread(sock: socket.socket) -> bool:
    """Whether ``sock`` has bytes (or its end) waiting to be read; without waiting."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed meanwhile
        return False


class Server(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``max_connections`` connections at once
    (the others wait, unaccepted, in a backlog of ``BACKLOG``) and logs a failed request in
    one line rather than socketserver's traceback."""

    daemon_threads = True
    request_queue_size = BACKLOG
    max_connections = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]):
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._closing = False
        # Connections still without a complete request head, oldest first: when accepted.
        self._heads: dict[socket.socket, float] = {}
        self._lock = threading.Lock()
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept only with a connection slot free: while all are taken, new connections
        wait in the backlog, and no thread is started for them; the one that has waited
        longest for its request head (``EVICT_AFTER`` seconds at least) is closed."""
        while not self._slots.acquire(blocking=False):
            if self._closing:
                raise OSError("the server is stopping")
            self._evict()
            if self._slots.acquire(timeout=SLOT_POLL):
                break
        try:
            request, address = super().get_request()
        except OSError:
            self._slots.release()
            raise
        with self._lock:
            self._heads[request] = time.monotonic()
        return request, address

    def _evict(self) -> None:
        now = time.monotonic()
        with self._lock:
            for request, at in self._heads.items():  # oldest first
                if now - at < EVICT_AFTER:
                    return
                if not _unread(request):
                    del self._heads[request]
                    break
            else:
                return
        log.debug("all connections taken: closed one that sent no request")
        with contextlib.suppress(OSError):  # its thread reads the end and frees the slot
            socket.socket.shutdown(request, socket.SHUT_RDWR)

    def head_done(self, request: Any) -> None:
        """The connection's request head has arrived: it is no longer one to evict."""
        with self._lock:
            self._heads.pop(request, None)

    def shutdown_request(self, request: Any) -> None:
        """Called once for every connection accepted, however it ended: its slot is free."""
        try:
            self.head_done(request)
            super().shutdown_request(request)
        finally:
            self._slots.release()

    def shutdown(self) -> None:
        self._closing = True
        super().shutdown()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # a client that went away, or whose time ran out
            log.debug("request from %s ended: %s", client_address[0], exc)
        else:
            log.error("request from %s failed: %s: %s", client_address[0], type(exc).__name__, exc)
            log.debug("its traceback", exc_info=True)
