"""Multi-turn, tool-using environments and the token-in/token-out episode runner.

::

    from forge.envs import Environment, StepResult, ToolSet, build_env, python_tool, run_episode

    async with generator.session():
        traj = await run_episode(build_env(MyEnv), task, generator.generate.route, tokenizer,
                                 tools=ToolSet([python_tool()]), sampling={"max_tokens": 256})

Environments in their own processes: ``forge.actors.env_actor`` (``EnvActor``, ``RemoteEnv``).
"""

from forge.envs.chat import ChatRenderer
from forge.envs.environment import Environment, FunctionEnv, build_env, call_env
from forge.envs.messages import (
    FINISH_REASONS,
    EnvContractError,
    Message,
    StepResult,
    Trajectory,
    as_step_result,
    to_messages,
)
from forge.envs.runner import EnvError, run_episode, sum_rewards
from forge.envs.sandbox import SandboxResult, python_tool, run_python
from forge.envs.tool_parser import (
    HermesToolParser,
    ToolCall,
    ToolCallError,
    ToolParser,
    build_tool_parser,
)
from forge.envs.tools import Tool, ToolResult, ToolSet, tool, tools_system_prompt
from forge.envs.window import HistoryWindow, window_messages

__all__ = [
    "FINISH_REASONS",
    "ChatRenderer",
    "EnvError",
    "Environment",
    "FunctionEnv",
    "HermesToolParser",
    "HistoryWindow",
    "Message",
    "SandboxResult",
    "StepResult",
    "EnvContractError",
    "as_step_result",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolParser",
    "ToolResult",
    "ToolSet",
    "Trajectory",
    "build_env",
    "build_tool_parser",
    "call_env",
    "python_tool",
    "run_episode",
    "run_python",
    "sum_rewards",
    "to_messages",
    "tool",
    "tools_system_prompt",
    "window_messages",
]
