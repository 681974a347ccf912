"""Teacher scoring tokens/s: the TeacherService vs one request per turn (the TCOD reference
pattern), same full-history trajectories of the tiny model, for two backends:

- hf: in process; the service micro-batches requests from concurrent callers and scores each
  episode's nested turns in one forward pass (ModelTeacher). Goal: at least 5x.
- remote: a real vLLM OpenAI-compatible server of the same model on 127.0.0.1
  (models.vllm_server); one HTTP request per turn, one after the other, vs the service over
  the remote backend (nested turns: one request per episode; concurrent requests, which the
  server batches). Goal: at least 4x.

    python benchmarks/teacher_throughput.py [--trajectories 8] [--turns 20] [--callers 8] [--no-remote]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--callers", type=int, default=8, help="concurrent rollout workers sending requests")
    parser.add_argument("--turns", type=int, default=20, help="the seeds ran 20-30 turns")
    parser.add_argument("--model", default="tiny:tiny")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-remote", action="store_true", help="skip the remote backend (no vLLM server)")
    args = parser.parse_args()

    import torch

    from actors.agent_loop import EpisodeTask, LoopConfig, ModelPolicy, run_episodes
    from actors.engine import SamplingConfig
    from actors.hf_engine import HFEngine
    from envs.babyai_text import BabyAITextEnv
    from envs.prompt import PromptConfig
    from models.loading import ModelConfig, load_model, load_tokenizer
    from teacher.backends import HFTeacherBackend, ScoreRequest
    from teacher.service import ModelTeacher, TeacherConfig, TeacherService

    torch.set_num_threads(args.threads)
    cfg = ModelConfig(path=args.model)
    tok = load_tokenizer(cfg)
    model = load_model(cfg)
    loop = LoopConfig(max_turns=args.turns, prompt=PromptConfig(history_window="all"))
    policy = ModelPolicy(HFEngine(model, tok.pad_token_id, [tok.convert_tokens_to_ids("<|im_end|>")]), tok,
                         SamplingConfig(max_new_tokens=24, seed=0), loop)
    trajectories = [r.trajectory for r in run_episodes(
        BabyAITextEnv, [EpisodeTask("train", s) for s in range(args.trajectories)], policy, loop, batch_size=16)]
    turns = [t for traj in trajectories for t in traj.turns]
    scored_tokens = sum(len(t.response_ids) for t in turns)
    print(f"trajectories={len(trajectories)} turns={len(turns)} scored_tokens={scored_tokens} "
          f"mean_prompt={sum(len(t.prompt_ids) for t in turns) / len(turns):.0f} tokens")

    def measure(backend, label: str, goal: float) -> float:
        backend.score([ScoreRequest(turns[0].prompt_ids, turns[0].response_ids)])  # warm-up
        start = time.perf_counter()
        for turn in turns:
            backend.score([ScoreRequest(turn.prompt_ids, turn.response_ids)])
        per_turn = scored_tokens / (time.perf_counter() - start)

        async def service_run() -> float:
            service = TeacherService(TeacherConfig(batch_window_s=0.05, max_batch_turns=64), ModelTeacher(backend))
            per_caller = [trajectories[i::args.callers] for i in range(args.callers)]

            async def caller(mine):
                for traj in mine:
                    await service.score([traj])

            start = time.perf_counter()
            await asyncio.gather(*[caller(m) for m in per_caller])
            elapsed = time.perf_counter() - start
            stats = await service.stats()
            print(f"{label} service: {stats['num_batches']} batches, {stats['mean_batch_turns']:.1f} turns each, "
                  f"latency p50 {stats['latency_p50_s'] * 1000:.0f} ms")
            return scored_tokens / elapsed

        batched = asyncio.run(service_run())
        print(f"{label}: one request per turn {per_turn:8.0f} scored tokens/s; service {batched:8.0f}; "
              f"{batched / per_turn:.2f}x (goal >= {goal:g}x)")
        return batched / per_turn

    result = {"batched_over_per_turn": measure(HFTeacherBackend(model, tok.pad_token_id, max_batch_tokens=32768),
                                               "hf", 5)}
    if not args.no_remote:
        from models.vllm_server import ServerConfig, VLLMServer
        from teacher.remote import RemoteConfig, RemoteTeacherBackend

        with VLLMServer(ServerConfig(model=cfg, max_model_len=4096)) as server:
            remote = RemoteTeacherBackend(RemoteConfig(url=server.url), tok)
            result["remote_batched_over_per_turn"] = measure(remote, "remote", 4)
            remote.close()
    print("RESULT " + " ".join(f"{key}={value:.2f}" for key, value in result.items()))


if __name__ == "__main__":
    main()
