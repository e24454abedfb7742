"""Adapters to environments and datasets from the ecosystem (``pip install 'forge[envs]'``).

| module | what it adapts | slot names |
|---|---|---|
| ``reasoning_gym`` | reasoning-gym's procedural datasets and their ``score_answer`` | data ``reasoning_gym``, reward ``reasoning_gym`` |
| ``verifiers`` | verifiers 0.4 ``vf.Env``s (single-turn, multi-turn, toolsets; ``@vf.reward`` functions as weighted components) | data ``verifiers``, env ``verifiers`` |
| ``textarena`` | textarena's offline text games against a fixed opponent | env ``textarena`` |
| ``openenv`` | OpenEnv environments served over HTTP | env ``openenv`` |

Each module imports its package only when an adapter is built, and says what to install
when it is missing. ``docs/environments.md`` has a runnable config per adapter.
"""
