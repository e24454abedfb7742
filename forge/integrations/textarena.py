"""TextArena's offline text games as Forge environments, against a fixed opponent.

``TextArenaEnv`` plays one game of ``textarena.make(game)`` per episode: the model holds
one seat (``player_id``), an opponent plays every other seat, and each model turn is one
textarena ``step``. Built-in slot name ``textarena`` (``pip install textarena``)::

    env:
      fn: {fn: textarena, kwargs: {game: TicTacToe-v0, opponent: random}}
      max_turns: 6
    data: {fn: forge.integrations.textarena:TextArenaSeeds, kwargs: {num_heldout: 8}}

What the model sees: at reset, the messages textarena sent its seat (the game's rules
prompt and first board); after each move, the messages since then (the opponent's moves,
textarena's descriptions of them, invalid-move notices), formatted as textarena's
``LLMObservationWrapper`` formats them (``[GAME] ...``, ``[Player 1] ...``) but only the new
ones, since the conversation already holds the rest. ``boards="last"`` keeps only the
newest board rendering of a batch (a board is the whole position, so older ones add only
tokens). Actions go through the game's own action wrappers (``ActionFormattingWrapper``
adds the ``[...]`` brackets a bare ``4`` lacks).

Rewards arrive on the last step, as components that sum to textarena's reward for the
model's seat: ``success`` 1 on a win (a reward of 1 or more), ``invalid`` -1 on a loss by
invalid moves, ``outcome`` the rest (-1 a loss, 0 a draw, a single-player game's partial
score). Invalid moves follow textarena's rules: a first invalid move is answered with a
notice and the model moves again (``info["invalid_move"]``), a second in a row loses.

Opponents: ``"random"`` plays a uniformly random *valid* move among those the game names in
brackets in the opponent's observation (TicTacToe's ``Available Moves: '[0]', '[4]'``, a
rules example such as ConnectFour's ``'[col 4]'``: then only those, so pass ``moves``),
each candidate checked on a deep copy of the game, or among ``moves`` when given; with no
valid candidate it raises ``RuntimeError`` (the episode ends as ``env_error``). Otherwise a
callable or import string ``fn(observation) -> action`` (a ``textarena.Agent`` works: it
gets the opponent's whole history as ``LLMObservationWrapper`` renders it); an import
string naming a class is instantiated without arguments.

Seeds: textarena seeds Python's global ``random`` in ``reset`` (``random.seed(seed)``), so a
game's own randomness (shuffled cards) is reproducible only if nothing else draws from the
global generator meanwhile; the random opponent has its own generator, seeded by the task.
"""

from __future__ import annotations

import copy
import difflib
import random
import re
from collections.abc import Callable
from typing import Any

from forge.envs import Environment, StepResult

__all__ = ["TextArenaEnv", "TextArenaSeeds"]

_BRACKETED = re.compile(r"\[[^\[\]\n]{1,40}\]")


def _textarena():
    try:
        import textarena
    except ImportError as e:
        raise ImportError(
            "the textarena environment needs the textarena package: pip install textarena "
            "(or pip install 'forge[envs]')"
        ) from e
    return textarena


def _resolve_opponent(opponent: Any) -> Callable[[str], str] | None:
    """``None`` for the built-in random player, else a callable ``fn(observation)``."""
    if opponent == "random":
        return None
    if isinstance(opponent, str):
        from forge.plugins import import_string

        if ":" not in opponent:
            raise ValueError(
                f"textarena opponent {opponent!r} is neither 'random' nor an import string "
                "'package.module:attr' of a function fn(observation) -> action"
            )
        opponent = import_string(opponent)
        if isinstance(opponent, type):
            opponent = opponent()
    if not callable(opponent):
        raise TypeError(
            f"textarena opponent must be 'random', an import string or a callable "
            f"fn(observation) -> action, got {type(opponent).__name__}"
        )
    return opponent


class TextArenaEnv(Environment):
    """One textarena game per episode, the model in seat ``player_id``.

    Args:
        game: a registered textarena id (``TicTacToe-v0``, ``Nim-v0``, ...).
        opponent: ``"random"``, or ``fn(observation) -> action`` / its import string; it
            plays every seat but the model's.
        player_id: the model's seat; a task's ``player_id`` overrides it.
        num_players: the game's player count (1 for single-player games).
        seed: the game's and the random opponent's seed when the task has no ``seed``.
        boards: ``"last"`` (the newest board of each batch of messages) or ``"all"``.
        moves: every move the random opponent may try (it plays a valid one at random),
            for games whose text does not list their moves (Nim: ``[0 1]``, ``[0 2]``, ...).
        game_kwargs: keyword arguments for ``textarena.make`` (the game's options).

    ``reset(task)``: ``task`` may be a dict with ``seed`` (episodes with one seed play the
    same game, e.g. the random opponent answers a move the same way) and ``player_id``.
    """

    @classmethod
    def check_config(cls, **kwargs: Any) -> None:
        """At config load: the arguments must make an environment (building one is cheap:
        nothing is played or connected before ``reset``)."""
        cls(**kwargs)

    def __init__(
        self,
        game: str,
        opponent: str | Callable[[str], str] = "random",
        player_id: int = 0,
        num_players: int = 2,
        seed: int | None = None,
        boards: str = "last",
        moves: list[str] | None = None,
        game_kwargs: dict[str, Any] | None = None,
    ) -> None:
        ta = _textarena()
        registry = ta.envs.registration.ENV_REGISTRY
        if game not in registry:
            close = difflib.get_close_matches(game, list(registry), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"textarena game {game!r} is not registered{hint}")
        if not 0 <= player_id < num_players:
            raise ValueError(f"player_id {player_id} is not a seat of a {num_players}-player game")
        if boards not in ("last", "all"):
            raise ValueError(f"boards must be 'last' or 'all', got {boards!r}")
        self.game, self.player_id, self.num_players = game, player_id, num_players
        self.seed, self.boards = seed, boards
        self.game_kwargs = dict(game_kwargs or {})
        self.opponent = _resolve_opponent(opponent)
        self.moves = list(moves) if moves is not None else None
        self.env: Any = None

    # -- the Environment interface --------------------------------------------------------
    # Plain coroutines that never await: textarena seeds Python's global RNG in reset, so a
    # reset must not interleave with another episode's (a worker thread could).

    async def reset(self, task: Any) -> str:
        ta = _textarena()
        fields = task if isinstance(task, dict) else {}
        seed = fields.get("seed", self.seed)
        self.player = int(fields.get("player_id", self.player_id))
        self.rng = random.Random(seed)
        self.env = ta.make(self.game, **self.game_kwargs)
        self.base = self.env
        while isinstance(self.base, ta.Wrapper):
            self.base = self.base.env
        try:
            self.env.reset(num_players=self.num_players, seed=seed)
        except AssertionError as e:
            raise ValueError(
                f"textarena {self.game}: reset(num_players={self.num_players}) failed ({e}); "
                "set num_players to the game's player count"
            ) from None
        self.history: dict[int, list] = {pid: [] for pid in range(self.num_players)}
        text, done = self._advance()
        if done:
            raise RuntimeError(f"textarena {self.game} ended before the model's first move")
        return text

    async def step(self, action: str) -> StepResult:
        state = self.base.state
        errors = getattr(state, "error_count", 0)
        done, _ = self.env.step(action)
        # A retry granted after an invalid move leaves the turn with the model.
        info = {"invalid_move": not done and getattr(state, "error_count", 0) > errors}
        text, done = (self._drain(self.player), True) if done else self._advance()
        if not done:
            return StepResult(text, info=info)
        rewards, game_info = self.env.close()
        mine = game_info.get(self.player, {})
        r = float((rewards or {}).get(self.player, 0.0))
        invalid = r if mine.get("invalid_move") else 0.0
        success = 1.0 if r >= 1.0 else 0.0
        info.update(reason=mine.get("reason"), rewards=dict(rewards or {}))
        info["invalid_move"] = bool(mine.get("invalid_move"))
        reward = {"success": success, "invalid": invalid, "outcome": r - success - invalid}
        return StepResult(text or None, reward=reward, done=True, info=info)

    async def close(self) -> None:
        self.env = None

    # -- turns ----------------------------------------------------------------------------

    def _advance(self) -> tuple[str, bool]:
        """Let the opponent play until it is the model's turn; ``(model's text, done)``."""
        state = self.base.state
        while not state.done:
            pid, messages = self.base.get_observation()
            if pid == self.player:
                return self._render(messages), False
            self.history[pid] += messages
            move = self._opponent_move(pid, messages)
            self.env.step(move)
        return self._drain(self.player), True

    def _drain(self, pid: int) -> str:
        """The messages waiting for seat ``pid`` (the game is over: nobody else reads them)."""
        messages = self.base.state.observations.get(pid, [])
        self.base.state.observations[pid] = []
        return self._render(messages)

    def _name(self, sender: int) -> str:
        if sender == -1:
            return "GAME"
        return self.base.state.role_mapping.get(sender, f"Player {sender}")

    def _render(self, messages: list) -> str:
        """New messages for the model, as LLMObservationWrapper writes them, minus the
        echo of its own move (already in the conversation) and superseded boards."""
        ta = _textarena()
        board = ta.ObservationType.GAME_BOARD
        boards = [i for i, m in enumerate(messages) if m[2] == board]
        lines = []
        for i, (sender, text, kind) in enumerate(messages):
            if sender == self.player and kind == ta.ObservationType.PLAYER_ACTION:
                continue
            if kind == board and self.boards == "last" and i != boards[-1]:
                continue
            lines.append(f"[{self._name(sender)}] {text}")
        return "\n".join(lines)

    def _opponent_move(self, pid: int, messages: list) -> str:
        if self.opponent is not None:
            full = "".join(f"\n[{self._name(s)}] {t}" for s, t, _ in self.history[pid])
            return str(self.opponent(full))
        if self.moves is not None:
            sources = [self.moves]
        else:  # the moves named in the newest messages first, then anywhere in its history
            sources = [
                list(dict.fromkeys(m for _, t, _ in source for m in _BRACKETED.findall(t)))
                for source in (messages, self.history[pid])
            ]
        for candidates in sources:
            valid = [m for m in candidates if self._valid(pid, m)]
            if valid:
                return self.rng.choice(valid)
        raise RuntimeError(
            f"textarena {self.game}: the random opponent (seat {pid}) found no valid move among "
            "the moves it was given or the game shows it; pass moves=[...] or "
            "opponent=fn(observation) -> action"
        )

    def _valid(self, pid: int, move: str) -> bool:
        """Whether ``move`` is valid for seat ``pid`` now, tried on a copy of the game."""
        trial = copy.deepcopy(self.env)
        state = trial.state
        errors = getattr(state, "error_count", 0)
        trial.step(move)
        if state.game_info.get(pid, {}).get("invalid_move"):
            return False
        return getattr(state, "error_count", 0) <= errors or state.current_player_id != pid


class TextArenaSeeds:
    """Tasks ``{"seed": k}`` for seeded environments (textarena games, OpenEnv servers whose
    ``reset`` takes a seed): training seeds drawn from ``num_heldout..num_heldout+num_train-1``,
    held out: ``0..num_heldout-1`` once each (never drawn for training)."""

    def __init__(self, num_train: int = 10_000, num_heldout: int = 8, seed: int = 0):
        if num_train < 1 or num_heldout < 0:
            raise ValueError(
                f"need num_train >= 1, num_heldout >= 0; got {num_train}, {num_heldout}"
            )
        self.num_train, self.num_heldout = num_train, num_heldout
        self.rng = random.Random(seed)

    def sample(self) -> dict:
        k = self.num_heldout + self.rng.randrange(self.num_train)
        return {"seed": k, "prompt": f"seed {k}"}

    def heldout(self) -> list[dict]:
        return [{"seed": k, "prompt": f"seed {k}"} for k in range(self.num_heldout)]

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
