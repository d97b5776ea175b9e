"""``thinkgate serve`` as a real process, for the HTTP tests: started on a free loopback
port, waited for until it prints its ready line, stopped with SIGTERM."""

from __future__ import annotations

import re

from .processes import Process


class Server(Process):
    """``thinkgate serve ARGS --port 0``; ``url`` is where it listens (``.../v1`` is
    ``base_url``)."""

    def __init__(self, args: list[str], **kwargs) -> None:
        super().__init__(
            ["serve", *args, "--host", "127.0.0.1", "--port", "0"],
            r"thinkgate serving on (http://\S+)",
            **kwargs,
        )
        assert self.match is not None
        self.url = self.match.group(1)
        self.base_url = self.url + "/v1"

    @property
    def engine_pid(self) -> int:
        m = re.search(r"engine ready in .* \(pid (\d+)", self.output)
        assert m is not None, self.output
        return int(m.group(1))
