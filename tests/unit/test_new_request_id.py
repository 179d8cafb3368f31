"""The gateway's own request ids, cut from random bytes drawn 4 KiB at a time: 32 hex digits each,
never repeated across draws, and a forked child draws its own."""

from __future__ import annotations

import os
import re

from kvgate.gateway.request_path.forwarding import new_request_id


def test_ids_are_32_hex_digits_and_distinct_across_several_draws() -> None:
    ids = [new_request_id() for _ in range(1000)]
    assert all(re.fullmatch("[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    new_request_id()  # the parent holds a partly used draw
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, "".join(new_request_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    parent = "".join(new_request_id() for _ in range(4))
    assert len(child) == len(parent) == 128
    assert child != parent
