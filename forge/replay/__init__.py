"""Replay buffer core: episodes in, ``dp_size`` padded batches out, with off-policy limits."""

from forge.replay.buffer import ReplayBufferCore
from forge.replay.collate import collate_episodes, join_rows, split_rows
from forge.replay.policies import (
    EvictionPolicy,
    FifoEvictionPolicy,
    FifoSamplePolicy,
    NewestSamplePolicy,
    SamplePolicy,
    UniformSamplePolicy,
    build_eviction_policy,
    build_sample_policy,
)

__all__ = [
    "EvictionPolicy",
    "FifoEvictionPolicy",
    "FifoSamplePolicy",
    "NewestSamplePolicy",
    "ReplayBufferCore",
    "SamplePolicy",
    "UniformSamplePolicy",
    "build_eviction_policy",
    "build_sample_policy",
    "collate_episodes",
    "join_rows",
    "split_rows",
]
