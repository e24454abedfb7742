"""Teacher actors for fault tests, importable by actor processes."""

from __future__ import annotations

import os

from forge.actors.teacher import Teacher


class DiesOnceTeacher(Teacher):
    """A ``Teacher`` whose first batch of ``score`` calls (the one that creates ``marker``)
    kills its own process mid-batch; later batches, on any replica, score as a ``Teacher``'s."""

    def __init__(self, config, marker: str) -> None:
        super().__init__(config)
        self.marker = marker

    def _score_requests(self, requests):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return super()._score_requests(requests)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os._exit(9)  # dies while the calls are in flight
