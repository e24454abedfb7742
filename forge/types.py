"""Message types passed between Forge components.

Endpoints exchange these small dataclasses, never loose dicts. Token ids are plain lists of
ints (cheap to pickle, no tensor aliasing); per-token float sequences are lists too, and the
trainer turns a batch of them into padded tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    """How to sample a completion. Mirrors the common subset of vLLM's ``SamplingParams``."""

    n: int = 1
    """Completions per prompt."""
    max_tokens: int = 64
    """Most tokens sampled per completion."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    top_p: float = 1.0
    """Nucleus sampling's mass (1.0: off; an RL run must leave it off)."""
    top_k: int = 0
    """Sample among the k likeliest tokens (0: off; an RL run must leave it off)."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion."""
    seed: int | None = None
    """Makes this request's sampling reproducible (``None``: the generator's seed)."""
    logprobs: bool = True
    """Return each *sampled* token's logprob (Forge's generators always do: RL needs them)."""
    ignore_eos: bool = False
    """Keep sampling past the end-of-sequence token until ``max_tokens`` or a stop string
    (fixed-length generations for benchmarks and tests)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0, got {self.top_k}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]


@dataclass
class Completion:
    """One sampled continuation of a prompt.

    ``logprobs[i]`` is the generator's log-probability of ``token_ids[i]``, as sampled, under
    the weights of ``generator_version``: the version the request started with. The vllm
    backend's in-flight updates let a running request continue on newer weights (tokens
    after the update are sampled by them, ``logprobs`` still the sampled ones; see
    ``forge.generation.vllm_backend``), so there it is the oldest version in the completion.
    ``stop_reason`` is ``"stop"`` (EOS or a stop string) or ``"length"`` (hit ``max_tokens``).
    """

    prompt: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    stop_reason: str
    generator_version: int
    adapter: str | None = None  # the LoRA adapter that sampled it (lora_mode multi)


@dataclass
class Episode:
    """A completion scored and ready for training.

    ``policy_version`` is the weight version that generated the response (the replay buffer
    uses it for its policy-age limit); for a multi-turn episode, the oldest version that
    sampled one of its turns. ``advantage`` is filled once the whole group is scored.
    ``ref_logprobs`` is set only when a reference model is used.

    Multi-turn episodes put the whole conversation after the first prompt in
    ``response_ids`` and set ``loss_mask`` (one 0/1 per response token): 1 on tokens the
    policy sampled, 0 on environment, tool and chat-template tokens, which then count in no
    loss. ``behavior_logprobs`` hold 0.0 at masked positions. ``None`` means every response
    token counts (single-turn).

    ``row_starts`` (history windows, ``forge.envs.window``): positions in ``response_ids``
    where a turn's own training row begins. Each row is its prompt (the tokens before its
    first sampled token) and what it sampled, and sees nothing before its start;
    ``collate_episodes`` makes one batch row of each (``forge.replay.split_rows``).
    """

    episode_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logprobs: list[float]
    reward: float
    policy_version: int
    group_id: str = ""
    advantage: float = 0.0
    ref_logprobs: list[float] | None = None
    target: Any = None
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    stop_reason: str = "stop"
    loss_mask: list[int] | None = None
    token_advantages: list[float] | None = None
    turn_rewards: list[float] | None = None
    bootstrap_at: int | None = None
    row_starts: list[int] | None = None
    teacher_logprobs: list[float] | None = None
    """On-policy distillation: the teacher's logprob of each response token (the episode log
    shows where it and ``behavior_logprobs`` disagree most)."""
    teacher_topk: TeacherTopK | None = None
    """GKD (``teacher.signal: gkd``): the teacher's top-k per response token, the trainer's
    distillation-loss targets."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class TrainBatch:
    """A padded batch for one data-parallel rank. Shapes: ``[B, T]``.

    ``response_mask_bt`` is 1 on response tokens that count in the loss; logprob tensors are
    aligned with ``input_ids_bt`` (position t holds the logprob of token t given tokens < t;
    position 0 and prompt positions are 0 and masked out).

    ``advantages_b`` is ``[B]`` (one per episode) or, when an episode carries per-token
    advantages (credit over turns, or a critic's GAE), ``[B, T]``. ``turn_rewards``: each
    row's per-turn rewards (a list of lists) when every episode has them. ``row_episode_b``
    is set when an episode was split into a row per turn (history windows): rows of one
    episode share its index and come in turn order, so a critic over turns runs its GAE
    across them.
    """

    input_ids_bt: Any
    attention_mask_bt: Any
    response_mask_bt: Any
    behavior_logprobs_bt: Any
    advantages_b: Any
    ref_logprobs_bt: Any = None
    policy_versions_b: Any = None
    rewards_b: Any = None  # each row's scalar reward (for value-based advantages, e.g. GAE)
    turn_rewards: Any = None
    bootstrap_at_b: Any = None  # [B] int64: where to read a truncated row's final value, -1: none
    row_episode_b: Any = None  # [B] int64: each row's episode (history windows: a row per turn)
    teacher_topk: Any = None  # GKD: a TopKTargets when some episode has teacher_topk


@dataclass
class TeacherScore:
    """An on-policy-distillation teacher's view of one sampled response (``Teacher.score``).

    ``logprobs[i]`` is the teacher's log-probability of ``response_ids[i]`` after its prompt
    (the student's, or a privileged one) and the response before it, at the policy's
    temperature; ``entropy[i]`` is the entropy (nats) of the teacher's distribution at that
    position. One of each per response token.
    """

    logprobs: list[float]
    entropy: list[float]
    topk_ids: list[list[int]] | None = None
    """With ``top_k`` asked for (GKD): the teacher's ``k`` likeliest token ids at each response
    position, likeliest first."""
    topk_logprobs: list[list[float]] | None = None
    """Their logprobs, of the teacher's full-vocabulary distribution at that position."""


@dataclass
class TeacherTopK:
    """An episode's GKD targets (``Episode.teacher_topk``): per response token the teacher's
    ``k`` likeliest ids and their logprobs (``TeacherScore.topk_*``), and the loss settings of
    the teacher that scored it (``forge.losses.gkd``: ``beta``; ``coef`` weighs the term)."""

    ids: list[list[int]]
    logprobs: list[list[float]]
    beta: float
    coef: float


@dataclass
class TopKTargets:
    """A ``TrainBatch``'s GKD targets, aligned with ``input_ids_bt`` like the logprob tensors
    (position ``t`` holds the teacher's top-k for predicting token ``t``): ``ids_btk`` int64,
    ``logprobs_btk`` float32 (``-inf`` where a row has no targets or fewer than ``K``),
    ``beta_b`` and ``coef_b`` float32 ``[B]`` (``coef`` 0 on rows without targets)."""

    ids_btk: Any
    logprobs_btk: Any
    beta_b: Any
    coef_b: Any

    def to(self, device) -> TopKTargets:
        """These targets on ``device``."""
        return TopKTargets(*(t.to(device) for t in self._tensors()))

    def select(self, rows) -> TopKTargets:
        """The targets of rows ``rows`` (an index tensor)."""
        return TopKTargets(*(t[rows] for t in self._tensors()))

    def _tensors(self) -> tuple:
        return (self.ids_btk, self.logprobs_btk, self.beta_b, self.coef_b)
