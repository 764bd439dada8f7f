"""The notes demo live (examples/notes, issue 14): every tab on a note is a WebSocket on that note's
worker (GET /note/{id}/ws). An edit ({"text", "base"}) is committed to the note's SQLite file
before the sender gets {"ack": rev}, then passed on to every other socket on the note as
{"text", "rev", "from"}; an edit made on an old revision is answered with the current state
({"stale": true}) and writes nothing; POST /text is passed on too (from 0).

With a real client (Python's `websockets`, Debian python3-websockets 10.x) through `corral serve`
in its demo mode (no config: the notes worker found next to corral): two sockets on one note, one
on another note, a browser's same-origin Origin (127.0.0.1:port, which the worker sees only as
Corral-Host) accepted and a foreign one refused, and an acknowledged edit surviving a kill -9 of
the worker. The browser side (two Chromium tabs) is tests/node/notes_live.test.mjs.
"""
import asyncio
import json
import os
import signal

import pytest
import websockets

from corral_test_util import poll
from test_notes_demo import NOTES_WORKER, Notes

WAIT = 10  # seconds: the bound of every wait for a message


@pytest.fixture
def notes(server_factory, tmp_path):
    if not os.access(NOTES_WORKER, os.X_OK):
        pytest.skip(f"{NOTES_WORKER} is not built")
    n = Notes(server_factory, "demo", str(tmp_path / "state")).start()
    yield n
    if n.srv.proc.poll() is None:
        n.srv.signal(signal.SIGTERM)
        n.srv.wait_exit(timeout=15)


def origin(n):
    return f"http://{n.srv.host}:{n.srv.port}"  # what a browser on the page sends


def connect(n, key, from_origin=None):
    return websockets.connect(f"ws://{n.srv.host}:{n.srv.port}/note/{key}/ws",
                              origin=from_origin or origin(n), open_timeout=WAIT,
                              close_timeout=WAIT, max_size=None)


async def recv(ws):
    return json.loads(await asyncio.wait_for(ws.recv(), WAIT))


async def send(ws, **message):
    await ws.send(json.dumps(message))


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 60))


def test_edits_are_durable_before_the_ack_and_reach_the_other_tabs(notes):
    n = notes

    async def scenario():
        async with connect(n, "live") as a, connect(n, "live") as b, connect(n, "other") as c:
            ga, gb, gc = await recv(a), await recv(b), await recv(c)
            assert (ga["text"], ga["rev"], gb["text"], gb["rev"]) == ("", 0, "", 0), (ga, gb)
            assert ga["you"] != gb["you"]
            assert (gc["text"], gc["rev"]) == ("", 0)

            # An edit: committed before its ack, then passed on to the other tab.
            await send(a, text="hello ✓", base=0)
            assert await recv(a) == {"ack": 1}
            assert n.stored("live") == ("hello ✓", 1)  # in the file when acknowledged
            assert await recv(b) == {"text": "hello ✓", "rev": 1, "from": ga["you"]}

            # An edit made on an old revision: refused with the current state, nothing written.
            await send(b, text="from b, on rev 0", base=0)
            assert await recv(b) == {"text": "hello ✓", "rev": 1, "stale": True}
            assert n.stored("live") == ("hello ✓", 1)
            # b merges and sends again on rev 1; a sees it (and nothing of the refused one: the
            # next message a gets is this one).
            await send(b, text="hello ✓ and b", base=1)
            assert await recv(b) == {"ack": 2}
            assert await recv(a) == {"text": "hello ✓ and b", "rev": 2, "from": gb["you"]}

            # POST /text: every socket on the note gets it, from 0.
            assert n.save("live", "posted") == 3
            for ws in (a, b):
                assert await recv(ws) == {"text": "posted", "rev": 3, "from": 0}

            # Another note's socket saw none of it: the next message it gets is its own ack.
            await send(c, text="elsewhere", base=0)
            assert await recv(c) == {"ack": 1}
            assert n.stored("other") == ("elsewhere", 1)
            assert n.stored("live") == ("posted", 3)

            # Not an edit: an error, the socket stays open and the note unchanged.
            await a.send("not json")
            assert "error" in await recv(a)
            await send(a, text=5, base=3)
            assert "error" in await recv(a)
            await send(a, text="still open", base=3)
            assert await recv(a) == {"ack": 4}
            assert await recv(b) == {"text": "still open", "rev": 4, "from": ga["you"]}

    run(scenario())
    assert (n.text("live"), n.rev("live")) == ("still open", 4)
    n.stop()


def test_a_large_note_is_edited_and_passed_on(notes):
    """An edit carries the whole text: one of 3 MiB (over ws's default 1 MiB message limit, under
    POST /text's 8 MiB) is acknowledged and reaches the other tab."""
    n = notes
    big = "0123456789abcdef" * (3 * 1024 * 1024 // 16)

    async def scenario():
        async with connect(n, "big") as a, connect(n, "big") as b:
            await recv(a), await recv(b)
            await send(a, text=big, base=0)
            assert await recv(a) == {"ack": 1}
            m = await recv(b)
            assert (m["rev"], len(m["text"]), m["text"] == big) == (1, len(big), True)

    run(scenario())
    assert n.stored("big") == (big, 1)
    n.stop()


def test_a_browser_origin_passes_and_a_foreign_one_is_refused(notes):
    n = notes

    async def scenario():
        # The page's own origin, as "localhost:port" too (the worker sees Host: localhost and
        # the client's Host in Corral-Host).
        for own in (origin(n), f"http://localhost:{n.srv.port}"):
            host = own.split("://")[1]
            async with websockets.connect(f"ws://{host}/note/o/ws", origin=own,
                                          open_timeout=WAIT, close_timeout=WAIT) as ws:
                assert (await recv(ws))["rev"] == 0
        # A page on another site: 403 from the front, before any upgrade.
        with pytest.raises(websockets.exceptions.InvalidStatusCode) as e:
            async with connect(n, "o", from_origin="http://evil.example"):
                pass
        assert e.value.status_code == 403
        # The port is part of the origin.
        with pytest.raises(websockets.exceptions.InvalidStatusCode) as e:
            async with connect(n, "o", from_origin=f"http://{n.srv.host}:{n.srv.port + 1}"):
                pass
        assert e.value.status_code == 403

    run(scenario())
    n.stop()


def test_an_acknowledged_edit_survives_kill_9(notes):
    """The ack means durable: kill -9 of the worker right after it (no closer runs, the sockets
    are cut), `ctl retry`, and the next request's worker has the text; a new socket gets it."""
    n = notes

    async def edit_then_kill():
        async with connect(n, "k") as a, connect(n, "k") as b:
            ga = await recv(a)
            await recv(b)
            await send(a, text="acknowledged", base=0)
            assert await recv(a) == {"ack": 1}
            pid = n.workers()["note:k"]["pid"]
            os.kill(pid, signal.SIGKILL)
            # b loses its socket, maybe after the edit (queued with the ack, flushed just after)
            with pytest.raises(websockets.exceptions.ConnectionClosed):
                while True:
                    m = json.loads(await asyncio.wait_for(b.recv(), WAIT))
                    assert m == {"text": "acknowledged", "rev": 1, "from": ga["you"]}
            return pid

    pid = asyncio.run(asyncio.wait_for(edit_then_kill(), 60))
    poll(lambda: n.workers().get("note:k", {}).get("status") == "failed", 10,
         "the worker's failure after kill -9", interval=0.05)
    assert n.ctl("retry", "note:k").returncode == 0
    assert (n.text("k"), n.rev("k")) == ("acknowledged", 1)
    assert n.workers()["note:k"]["pid"] != pid

    async def reconnect():
        async with connect(n, "k") as a:
            g = await recv(a)
            assert (g["text"], g["rev"]) == ("acknowledged", 1)

    run(reconnect())
    n.stop(failures=1)


def test_the_greeting_names_the_worker_after_a_reconnect(notes):
    """A socket's greeting carries its worker's pid (the page shows it): after the worker stops
    and the page reconnects, the greeting names the new worker, not the one the page was served
    by."""
    n = notes

    async def greeting(key):
        async with connect(n, key) as ws:
            return await recv(ws)

    first = asyncio.run(asyncio.wait_for(greeting("r"), 60))
    pid = n.workers()["note:r"]["pid"]
    assert first["pid"] == pid, first
    assert n.ctl("stop", "note:r").returncode == 0
    poll(lambda: "note:r" not in n.workers(), 10, "the worker's stop", interval=0.05)
    again = asyncio.run(asyncio.wait_for(greeting("r"), 60))
    new_pid = n.workers()["note:r"]["pid"]
    assert new_pid != pid and again["pid"] == new_pid, (again, pid, new_pid)
    n.stop()
