"""A tiny OpenEnv environment for tests/integration/envs/test_openenv.py, built with openenv's own
base classes and served by its own ``create_app``: guess a number in 1..8 ("higher" /
"lower"), reward 1 on the right guess. ``uvicorn tests.integration.envs.openenv_game:app``."""

from __future__ import annotations

import random
import re
from uuid import uuid4

from openenv.core.env_server import Action, Environment, Observation, State, create_app


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    feedback: str = ""
    guesses: int = 0


class GuessEnvironment(Environment):
    """The secret comes from the reset's ``seed`` (or ``secret``); each session its own."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 0

    def reset(self, seed=None, episode_id=None, secret=None, **kwargs) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = int(secret) if secret is not None else random.Random(seed).randint(1, 8)
        return GuessObservation(feedback="Guess my number from 1 to 8.", reward=None)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        n = self._state.step_count
        digits = re.findall(r"\d+", action.message)
        if not digits:
            return GuessObservation(feedback="a number, please", reward=0.0, guesses=n)
        guess = int(digits[0])
        if guess == self.secret:
            return GuessObservation(feedback="correct", reward=1.0, done=True, guesses=n)
        word = "higher" if guess < self.secret else "lower"
        return GuessObservation(feedback=word, reward=0.0, guesses=n)

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=16
)
