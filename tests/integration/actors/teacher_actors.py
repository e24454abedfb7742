"""Teacher actors for fault tests, importable by actor processes."""

from __future__ import annotations

import os
from collections.abc import Sequence

from controller import endpoint
from forge.actors.teacher import Teacher


class DiesOnceTeacher(Teacher):
    """A ``Teacher`` whose first ``score`` call (the one that creates ``marker``) kills its
    own process mid-call; later calls, on any replica, score as a ``Teacher`` does."""

    def __init__(self, config, marker: str) -> None:
        super().__init__(config)
        self.marker = marker

    @endpoint
    def score(self, episodes: Sequence, prompts=None, top_k: int = 0):
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return self.core.score(episodes, prompts, top_k)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os._exit(9)  # dies while the call is in flight
