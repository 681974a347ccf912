"""A plain OpenAI-client agent for BabyAI-Text, trained by `jobs.train` through the gateway.

The gateway runs it once per session (env.command) with OPENAI_BASE_URL and OPENAI_API_KEY set,
so the stock client needs nothing else, and the task in APPRENTICE_TASK; with env.persistent it
runs once per slot and reads one session per line on stdin; `run` is the same agent as an
env.callable. It prompts as the built-in loop does (the rules and tool list, the task and
what it sees, then each call and the environment's answer), so its sessions train like built-in
episodes; the reward it posts is the environment's verdict.
"""

import json
import os
import sys

import httpx
import openai

from envs.prompt import PromptConfig, system_content
from envs.protocol import ToolCall
from envs.registry import make_env, parse_env_config

HTTP = httpx.Client()
"""One connection pool per program, as the openai docs advise: a client made per session spends
~40 ms of CPU on TLS setup even for plain HTTP, more than its session's ten calls to the gateway."""


def play(base_url: str, api_key: str, gateway_url: str, session_id: str, task: dict) -> None:
    env = make_env(parse_env_config(task["env"]))
    reset = env.reset(task["seed"], task["split"])
    observation, success = reset.observation, False
    messages = [{"role": "system", "content": system_content(PromptConfig(tools="compact"), env.system_prompt, env.tools)},
                {"role": "user", "content": f"Your task: {reset.task}\n\nWhat you see:\n{observation}"}]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, http_client=HTTP)
    for _ in range(task["max_turns"]):
        try:
            message = client.chat.completions.create(model="apprentice", messages=messages).choices[0].message
        except openai.BadRequestError:  # the gateway ended the session (turn or context limit)
            return
        call = message.tool_calls[0] if message.tool_calls else None
        step = None if call is None else env.step(ToolCall(call.function.name, json.loads(call.function.arguments)))
        observation = observation if step is None else step.observation
        error = (message.model_extra or {}).get("format_error")  # the gateway's reading of a malformed answer
        if error is None:
            messages += [{"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id, "content": observation}]
        else:
            acted = f"It was read as {call.function.name}." if call else "No action was taken."
            messages += [{"role": "assistant", "content": message.content},
                         {"role": "user", "content": f"Format error ({error['reason']}): answer with exactly one "
                                                     f"tool call. {acted}\n{observation}"}]
        if step is not None and step.done:
            success = step.success
            break
    HTTP.post(f"{gateway_url}/v1/sessions/{session_id}/reward", json={"success": success},
               headers={"Authorization": f"Bearer {api_key}"}).raise_for_status()


def run(session) -> None:
    """The env.callable entry: `examples.gateway_agent:run`."""
    play(session.base_url, session.api_key, session.gateway_url, session.session_id, session.task)


if __name__ == "__main__":
    if "APPRENTICE_SESSION_ID" in os.environ:
        play(os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], os.environ["APPRENTICE_GATEWAY_URL"],
             os.environ["APPRENTICE_SESSION_ID"], json.loads(os.environ["APPRENTICE_TASK"]))
    else:  # env.persistent: one session per line
        for line in sys.stdin:
            s = json.loads(line)
            play(s["base_url"], s["api_key"], s["gateway_url"], s["session_id"], s["task"])
