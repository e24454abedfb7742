"""Metrics: record from any process, reduce across processes per step, log to backends.

::

    record_metric("reward/mean", 0.75)                 # anywhere, any process
    states = get_collector().flush()                   # per process, each step
    values = merge_states([states, *remote_states])    # on the controller
    for backend in backends:
        backend.log(step, values)
"""

from forge.observability.backends import (
    ConsoleBackend,
    JsonlBackend,
    MetricBackend,
    TensorBoardBackend,
    WandbBackend,
    build_backends,
    read_jsonl,
)
from forge.observability.metrics import (
    MaxState,
    MeanState,
    MetricCollector,
    MinState,
    PartialState,
    Reduce,
    StdState,
    SumState,
    get_collector,
    merge_states,
    record_metric,
    reset_collector,
    timer,
)

__all__ = [
    "ConsoleBackend",
    "JsonlBackend",
    "MaxState",
    "MeanState",
    "MetricBackend",
    "MetricCollector",
    "MinState",
    "PartialState",
    "Reduce",
    "StdState",
    "SumState",
    "TensorBoardBackend",
    "WandbBackend",
    "read_jsonl",
    "build_backends",
    "get_collector",
    "merge_states",
    "record_metric",
    "reset_collector",
    "timer",
]
