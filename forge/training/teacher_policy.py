"""An on-policy-distillation teacher: a frozen model that scores the student's sampled tokens.

``TeacherCore(cfg).score(episodes, prompts)`` returns one :class:`~forge.types.TeacherScore`
per episode: the teacher's logprob of each response token and the entropy of its
distribution there, from one prefill of ``prompt + response`` per row (no sampling, no
grad). ``prompts`` (optional, one per episode) are privileged prompts only the teacher sees:
text or chat messages, encoded by the rule every generator follows
(``forge.generation.prompts.encode_prompt``) with the teacher's tokenizer, which the run
checked equals the student's at load (``forge.run.teacher_checks.check_tokenizers``); without them
the teacher reads the student's own prompt ids.

With ``top_k`` (GKD, ``teacher.signal: gkd``) the same prefill also gives, at each response
position, the teacher's ``top_k`` likeliest ids and their logprobs (``TeacherScore.topk_*``):
one log-softmax over the position's logits gives the sampled token's logprob, the entropy and
the top-k.

It is a :class:`~forge.training.reference_policy.ReferenceCore` (same loading, precision,
``micro_batch_size``, ``update_weights``), so the teacher service is the reference model's
machinery with one more endpoint (``forge.actors.teacher``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from forge.generation.prompts import Prompt, encode_prompt
from forge.models.logprobs import (
    effective_temperature,
    pad_and_stack,
    position_ids_from_mask,
    token_logprobs_entropy,
)
from forge.training.reference_policy import ReferenceCore
from forge.types import Episode, TeacherScore

__all__ = ["TeacherCore"]


class TeacherCore(ReferenceCore):
    """A reference core that also scores responses with entropies (see the module)."""

    _tokenizer = None

    def tokenizer(self):
        """The teacher's tokenizer (loaded on the first privileged prompt)."""
        if self._tokenizer is None:
            from forge.models import load_tokenizer
            from forge.training.lora import tokenizer_source

            self._tokenizer = load_tokenizer(tokenizer_source(self.cfg.model))
        return self._tokenizer

    def prompt_ids(self, episodes: Sequence[Episode], prompts: Sequence[Prompt] | None):
        """Each row's prompt ids: the privileged prompt's, or the episode's own."""
        if prompts is None:
            return [list(ep.prompt_ids) for ep in episodes]
        if len(prompts) != len(episodes):
            raise ValueError(f"{len(prompts)} teacher prompts for {len(episodes)} episodes")
        tok = self.tokenizer()
        limit = getattr(self.model.config, "max_position_embeddings", None)
        return [encode_prompt(tok, p, limit)[1] for p in prompts]

    @torch.no_grad()
    def score(
        self,
        episodes: Sequence[Episode],
        prompts: Sequence[Prompt] | None = None,
        top_k: int = 0,
    ) -> list[TeacherScore]:
        """One ``TeacherScore`` per episode (see the module); ``top_k > 0`` adds the top-k."""
        episodes = list(episodes)
        if not episodes or not all(isinstance(ep, Episode) for ep in episodes):
            raise TypeError("Teacher.score takes a non-empty list of Episode")
        prompt_ids = self.prompt_ids(episodes, prompts)
        responses = [list(ep.response_ids) for ep in episodes]
        ids_bt, mask_bt, _ = pad_and_stack(prompt_ids, responses, pad_id=0)
        per = self.cfg.micro_batch_size or len(episodes)
        lps, ents, top_ids, top_lps = [], [], [], []
        for start in range(0, len(episodes), per):
            ids = ids_bt[start : start + per].to(self.device)
            mask = mask_bt[start : start + per].to(self.device)
            if top_k:
                lp, ent, t_ids, t_lps = _with_topk(
                    self.model, ids, mask, self.cfg.temperature, top_k
                )
                top_ids.append(t_ids.cpu())
                top_lps.append(t_lps.cpu())
            else:
                lp, ent = token_logprobs_entropy(self.model, ids, mask, self.cfg.temperature)
            lps.append(lp.cpu())
            ents.append(ent.cpu())
        lp_bt, ent_bt = torch.cat(lps), torch.cat(ents)
        out = []
        for b, (p, r) in enumerate(zip(prompt_ids, responses)):
            span = slice(len(p), len(p) + len(r))
            score = TeacherScore(lp_bt[b, span].tolist(), ent_bt[b, span].tolist())
            if top_k:
                chunk, row = divmod(b, per)
                score.topk_ids = top_ids[chunk][row, span].tolist()
                score.topk_logprobs = top_lps[chunk][row, span].tolist()
            out.append(score)
        return out


def _with_topk(model, ids_bt, mask_bt, temperature: float, k: int):
    """``(logprobs_bt, entropy_bt, topk_ids_btk, topk_logprobs_btk)`` from one forward, aligned
    like ``token_logprobs_entropy``'s (position ``t``: the prediction of token ``t``; 0 at
    position 0). ``ValueError`` when ``k`` exceeds the vocabulary."""
    logits_btv = model(
        input_ids=ids_bt, attention_mask=mask_bt, position_ids=position_ids_from_mask(mask_bt)
    ).logits[:, :-1]
    if k > logits_btv.shape[-1]:
        raise ValueError(f"teacher.top_k={k} exceeds the vocabulary ({logits_btv.shape[-1]})")
    logp_btv = torch.log_softmax(logits_btv.float() / effective_temperature(temperature), -1)
    lp_bt = logp_btv.gather(-1, ids_bt[:, 1:].unsqueeze(-1)).squeeze(-1)
    ent_bt = -(logp_btv.exp() * logp_btv).sum(-1)
    top_lps_btk, top_ids_btk = logp_btv.topk(k, dim=-1)
    keep_bt = mask_bt[:, 1:].bool()
    lp_bt, ent_bt = lp_bt * keep_bt, ent_bt * keep_bt

    def pad(x):
        return torch.nn.functional.pad(x, (0, 0, 1, 0) if x.dim() == 3 else (1, 0))

    return pad(lp_bt), pad(ent_bt), pad(top_ids_btk), pad(top_lps_btk)
