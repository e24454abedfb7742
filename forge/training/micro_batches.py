"""How a trainer step cuts its rows into micro-batches: by size, by length (least padded
positions, ``length_cuts``), and under a cap of positions per micro-batch (``token_cap``).

Every rank gets the same number of micro-batches (``micro_rows`` all-reduces the count), so
ranks that call collectives per micro-batch stay in step.
"""

from __future__ import annotations

import math

import torch

from forge.training import parallel

__all__ = ["length_cuts", "micro_rows", "token_cap"]


def micro_rows(
    lengths: list[int],
    micro_batch_size: int | None,
    device: str,
    bucket_cost: int | None = None,
    prefixes: list[tuple[object, int]] | None = None,
    row_keys: list[object] | None = None,
) -> list[torch.Tensor]:
    """Row indices of each micro-batch; every rank gets the same (global max) count.

    ``bucket_cost`` (``None``: rows in batch order): rows are sorted by length, so a
    micro-batch pads to lengths close to its own; with ``micro_batch_size`` unset on one rank,
    the sorted rows are split where that saves positions (``length_cuts``; ``prefixes``: each
    row's shared prefix as ``(key, length)``, computed once per micro-batch that has it;
    ``row_keys``: rows with equal keys are computed once per micro-batch)."""
    rows = len(lengths)
    world = parallel.rank_and_world()[1]
    order = list(range(rows))
    if bucket_cost is not None:
        order.sort(key=lengths.__getitem__)
        if micro_batch_size is None and world == 1 and rows > 1:
            idx = torch.tensor(order, device=device)
            pre = None if prefixes is None else [prefixes[i] for i in order]
            keys = None if row_keys is None else [row_keys[i] for i in order]
            cuts = length_cuts([lengths[i] for i in order], bucket_cost, pre, keys)
            return [idx[a:b] for a, b in zip([0, *cuts], [*cuts, rows])]
    per = rows if micro_batch_size is None else micro_batch_size
    local = math.ceil(rows / per)
    n = local
    if world > 1:
        t = torch.tensor([local], device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        n = int(t.item())
    idx = torch.tensor(order, dtype=torch.long, device=device)
    return [idx[i * per : (i + 1) * per] for i in range(n)]


def token_cap(rows_m: torch.Tensor, lengths: list[int], cap: int) -> list[torch.Tensor]:
    """``rows_m`` in consecutive pieces of at most ``cap`` padded positions each (rows x the
    piece's longest row, ``lengths`` indexed by row); a row longer than ``cap`` is a piece of
    its own."""
    pieces, start, longest = [], 0, 0
    order = rows_m.tolist()
    for i, row in enumerate(order):
        longest = max(longest, lengths[row])
        if i > start and (i - start + 1) * longest > cap:
            pieces.append(rows_m[start:i])
            start, longest = i, lengths[row]
    pieces.append(rows_m[start:])
    return pieces


def length_cuts(
    sorted_lengths: list[int],
    cost: int,
    prefixes: list[tuple[object, int]] | None = None,
    row_keys: list[object] | None = None,
) -> list[int]:
    """Where to split ascending ``sorted_lengths`` so that the positions computed are least:
    per part, its rows x its longest row (rows with the same ``row_keys`` entry count once),
    plus each distinct prefix in it once (``prefixes``: per row ``(key, length)``), plus
    ``cost``. Exact dynamic programming over blocks of rows (single rows up to 128 rows; cuts
    fall on block edges beyond)."""
    n = len(sorted_lengths)
    block = max(1, math.ceil(n / 128))
    edges = list(range(0, n, block)) + [n]
    m = len(edges) - 1
    best, prev = [0.0] + [math.inf] * m, [0] * (m + 1)
    for j in range(1, m + 1):
        longest = sorted_lengths[edges[j] - 1]
        seen: set = set()
        shared = 0
        rows: set = set()
        for i in range(j - 1, -1, -1):  # part = blocks i..j-1
            if prefixes is not None:
                for key, plen in prefixes[edges[i] : edges[i + 1]]:
                    if key not in seen:
                        seen.add(key)
                        shared += plen
            if row_keys is None:
                count = edges[j] - edges[i]
            else:
                rows.update(row_keys[edges[i] : edges[i + 1]])
                count = len(rows)
            c = best[i] + cost + shared + count * longest
            if c < best[j]:
                best[j], prev[j] = c, i
    cuts, j = [], m
    while j > 0:
        j = prev[j]
        if j:
            cuts.append(edges[j])
    return cuts[::-1]
