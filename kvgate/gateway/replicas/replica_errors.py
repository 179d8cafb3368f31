"""How talking to a replica fails, as the completion routes' client raises it.

``kvgate.gateway.edge.errors.translate_upstream`` maps each for the client. These stay ordinary
classes when the module is compiled (setup.py): ``ReplicaTimeout`` is also a ``TimeoutError``, and
a compiled class cannot have two built-in bases.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr


@mypyc_attr(native_class=False)
class ReplicaHTTPError(Exception):
    """A failure talking to a replica."""


@mypyc_attr(native_class=False)
class ReplicaConnectError(ReplicaHTTPError):
    """No connection could be opened."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(os_error.strerror or str(os_error) or type(os_error).__name__)
        self.os_error = os_error


@mypyc_attr(native_class=False)
class ReplicaDisconnected(ReplicaHTTPError):
    """The replica closed the connection before its response was complete."""


@mypyc_attr(native_class=False)
class ReplicaProtocolError(ReplicaHTTPError):
    """The replica's answer was not valid HTTP/1.1."""


@mypyc_attr(native_class=False)
class ReplicaTimeout(ReplicaHTTPError, TimeoutError):
    """Connecting, the first byte or the next streamed chunk took longer than configured."""
