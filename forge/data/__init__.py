"""Prompt sources: objects with ``sample() -> {"prompt", "target"}`` and ``heldout()``.

Built-ins: ``JsonlSource`` (a local JSONL file) and ``HFSource`` (a Hugging Face dataset by
hub id or local path). Any class or factory with the same methods is a data source too; name
it in a config as ``{fn: mypkg.data:MySource, kwargs: {...}}`` (see ``forge.slots``).
"""

from forge.data.sources import DataSource, HFSource, JsonlSource, RecordSource

__all__ = ["DataSource", "HFSource", "JsonlSource", "RecordSource"]
