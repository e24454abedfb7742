"""An on-policy-distillation teacher: a frozen model that scores the student's sampled tokens.

``TeacherCore(cfg).score(episodes, prompts)`` returns one :class:`~forge.types.TeacherScore`
per episode: the teacher's logprob of each response token and the entropy of its
distribution there, from one prefill of ``prompt + response`` per row (no sampling, no
grad). ``prompts`` (optional, one per episode) are privileged prompts only the teacher sees:
text or chat messages, encoded by the rule every generator follows
(``forge.generation.prompts.encode_prompt``) with the teacher's tokenizer, which the run
checked equals the student's at load (``forge.run.teacher_checks.check_tokenizers``); without them
the teacher reads the student's own prompt ids.

It is a :class:`~forge.training.reference_policy.ReferenceCore` (same loading, precision,
``micro_batch_size``, ``update_weights``), so the teacher service is the reference model's
machinery with one more endpoint (``forge.actors.teacher``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from forge.generation.prompts import Prompt, encode_prompt
from forge.models.logprobs import pad_and_stack, token_logprobs_entropy
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
        self, episodes: Sequence[Episode], prompts: Sequence[Prompt] | None = None
    ) -> list[TeacherScore]:
        """One ``TeacherScore`` per episode (see the module)."""
        episodes = list(episodes)
        if not episodes or not all(isinstance(ep, Episode) for ep in episodes):
            raise TypeError("Teacher.score takes a non-empty list of Episode")
        prompt_ids = self.prompt_ids(episodes, prompts)
        responses = [list(ep.response_ids) for ep in episodes]
        ids_bt, mask_bt, _ = pad_and_stack(prompt_ids, responses, pad_id=0)
        per = self.cfg.micro_batch_size or len(episodes)
        lps, ents = [], []
        for start in range(0, len(episodes), per):
            ids = ids_bt[start : start + per].to(self.device)
            mask = mask_bt[start : start + per].to(self.device)
            lp, ent = token_logprobs_entropy(self.model, ids, mask, self.cfg.temperature)
            lps.append(lp.cpu())
            ents.append(ent.cpu())
        lp_bt, ent_bt = torch.cat(lps), torch.cat(ents)
        out = []
        for b, (p, r) in enumerate(zip(prompt_ids, responses)):
            span = slice(len(p), len(p) + len(r))
            out.append(TeacherScore(lp_bt[b, span].tolist(), ent_bt[b, span].tolist()))
        return out
