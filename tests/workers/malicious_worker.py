#!/usr/bin/python3
"""A worker that breaks HTTP on purpose, for tests of what corral's proxy does with it: it speaks
docs/worker-protocol.md by hand (fd 3 control link, fd 4 listening socket, the flock lock) and
writes its responses byte by byte as each route says. Standard library only.

Routes (the path the worker sees, after the kind's route):
  /headers       200, a JSON object of the request's headers (lower-case names): who asked
  /double        two complete 200 responses for the one request, in one write; the second's
                 body is {"extra": "double"}, so a client that gets it got someone else's answer
  /204extra      a 204 followed, in the same write, by a complete 200 response ({"extra": "204"})
  /cutchunk      a chunked 200 whose first chunk (16 bytes announced) is cut after 5; then close
  /nolastchunk   a chunked 200 with one whole chunk ("hello"), closed before the last chunk
  /shortcl       Content-Length: 100, 10 bytes of body, then close
  /hop           `Connection: X-Secret, close-not` with X-Secret and Close-Not fields (hop-by-hop
                 by being named there) and X-Kept (not named): only X-Kept may reach the client
  /gzipchunked   Transfer-Encoding: gzip, chunked, with a gzip body
  /pause?ms=N    200 at once (and the connection closes), then the worker accepts no connection
                 for N ms: no connection to it is served meanwhile
  anything else  200 "ok"

Every connection is kept alive and its requests are answered in order (pipelining), the request
bodies read by Content-Length or chunked. Environment:
  MALICIOUS_ECHO=1      every response written echoes the request's Corral-Seq field (as the
                        worker libraries do), the two of /double and the 204's extra included
  MALICIOUS_BACKLOG=N   listen(N) on fd 4 at start: a small accept queue, filled by a few
                        connections while /pause holds the accepts
"""
import fcntl
import gzip
import json
import os
import signal
import socket
import threading
import time

control = socket.socket(fileno=int(os.environ["CORRAL_CONTROL_FD"]))
listener = socket.socket(fileno=int(os.environ["CORRAL_LISTEN_FD"]))
ECHO = os.environ.get("MALICIOUS_ECHO") == "1"
paused_until = 0.0
pause_lock = threading.Lock()


def send(msg):
    control.send(json.dumps(msg).encode())


def response(status, body=b"", fields=(), reason="OK"):
    head = f"HTTP/1.1 {status} {reason}\r\n"
    for name, value in fields:
        head += f"{name}: {value}\r\n"
    if status not in (204, 304):
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def chunk(data):
    return b"%x\r\n" % len(data) + data + b"\r\n"


class Conn:
    """One accepted connection: its bytes read so far, and the requests parsed from them."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError
        self.buf += data

    def take_line(self):
        while b"\r\n" not in self.buf:
            self.fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def take(self, n):
        while len(self.buf) < n:
            self.fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def request(self):
        """(method, target, headers dict) of the next request, its body read and dropped."""
        while b"\r\n\r\n" not in self.buf:
            self.fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                size = int(self.take_line().split(b";")[0], 16)
                if size == 0:
                    while self.take_line():  # trailers, then the empty line
                        pass
                    break
                self.take(size + 2)
        else:
            self.take(int(headers.get("content-length", "0")))
        return method, target, headers


def answer(conn, method, target, headers):
    """Writes the answer to one request; False: the connection is to be closed."""
    path, _, query = target.partition("?")
    seq = [("Corral-Seq", headers["corral-seq"])] if ECHO and "corral-seq" in headers else []
    s = conn.sock
    if path == "/headers":
        s.sendall(response(200, json.dumps(headers).encode(),
                           seq + [("Content-Type", "application/json")]))
    elif path == "/double":
        s.sendall(response(200, b'{"first": true}', seq + [("Content-Type", "application/json")])
                  + response(200, b'{"extra": "double"}',
                             seq + [("Content-Type", "application/json")]))
    elif path == "/204extra":
        s.sendall(response(204, fields=seq, reason="No Content")
                  + response(200, b'{"extra": "204"}', seq + [("Content-Type", "application/json")]))
    elif path == "/cutchunk":
        s.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nhello")
        return False
    elif path == "/nolastchunk":
        s.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"hello"))
        return False
    elif path == "/shortcl":
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        return False
    elif path == "/hop":
        s.sendall(response(200, b"ok", seq + [("Connection", "X-Secret, close-not"),
                                              ("X-Secret", "s3cret"), ("Close-Not", "gone"),
                                              ("X-Kept", "yes")]))
    elif path == "/gzipchunked":
        body = gzip.compress(b"hello gzip\n")
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                  b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunk(body[:10]) + chunk(body[10:])
                  + b"0\r\n\r\n")
    elif path == "/pause":
        global paused_until
        ms = int(query.partition("ms=")[2] or "1000")
        with pause_lock:
            paused_until = time.monotonic() + ms / 1000
        s.sendall(response(200, b"paused", seq + [("Connection", "close")]))
        return False
    else:
        s.sendall(response(200, b"ok", seq))
    return True


def serve_connection(sock):
    conn = Conn(sock)
    try:
        while answer(conn, *conn.request()):
            pass
    except (EOFError, OSError, ValueError):
        pass
    finally:
        sock.close()


def accept_loop():
    while True:
        with pause_lock:
            wait = paused_until - time.monotonic()
        if wait > 0:
            time.sleep(wait)
            continue
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        with pause_lock:
            wait = paused_until - time.monotonic()
        if wait > 0:  # accepted while a pause began: not served before its end either
            time.sleep(wait)
        threading.Thread(target=serve_connection, args=(sock,), daemon=True).start()


def main():
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    if not os.environ.get("CORRAL_ADDRESS"):
        send({"type": "standby"})  # a warm spare: the address comes with `start`
    raw = control.recv(65536)
    if not raw:
        os._exit(0)
    msg = json.loads(raw)
    if msg.get("type") != "start":
        os._exit(0)
    lock = os.open(msg["lock"], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    send({"type": "started"})
    backlog = os.environ.get("MALICIOUS_BACKLOG")
    if backlog:
        listener.listen(int(backlog))
    threading.Thread(target=accept_loop, daemon=True).start()
    send({"type": "ready", "idle": True})
    while True:
        raw = control.recv(65536)
        if not raw:
            os._exit(0)
        m = json.loads(raw)
        if m.get("type") == "shutdown":
            os._exit(0)
        if m.get("type") == "ping":
            send({"type": "pong", "id": m["id"]})


main()
