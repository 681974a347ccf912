"""The judge backends the project ships, registered with judge.registry:

- `oracle`: the environment's expert replays the episode and scores the turn (judge/oracle.py);
- `http`: a judge model behind an OpenAI-compatible API, or the `judge.serve` server the judge's
  actor starts (judge/http.py).
"""

from __future__ import annotations

from judge.registry import JudgeBackendEntry, register_judge_backend


def _oracle(config, model, env):
    from envs.registry import make_env
    from judge.oracle import OracleJudge

    return OracleJudge(make_env(env))


def _http(config, model, env):
    from judge.http import HttpJudge
    from models.loading import load_tokenizer

    return HttpJudge(config.http, load_tokenizer(model))


def _served_http(config, url: str, model_name: str):
    # The episode must fit the served context beside the answer and the rubric.
    budget = min(config.http.max_episode_tokens, config.serve.max_model_len - config.http.max_tokens - 512)
    return config.model_copy(update={"http": config.http.model_copy(
        update={"base_url": url, "model": model_name, "max_episode_tokens": budget})})


register_judge_backend("oracle", JudgeBackendEntry(_oracle))
register_judge_backend("http", JudgeBackendEntry(_http, served=_served_http))
