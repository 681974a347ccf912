"""The learner's optimizer updates a second against plain PyTorch SFT on the same turns.

DAgger's gain on the study's level came with many small updates (docs/babyai_text.md, "The
labels, the rounds and the reuse"): the offline probe's ~2.6 updates of 32 turns a second. This
measures what the job's learner (`learner.trainer.Trainer` on one gloo rank, which a lone fp32
rank does not shard; the forward KL to the teacher's top-k, micro-batches, gradient clipping, its
statistics) costs per update against the probe's loop (one padded forward, cross-entropy,
AdamW) on the same turns: the bot's demonstrations of the study's level as the job trains them
(scored by their demonstrator, so the top-k term is their cross-entropy), the hour's model and
prompts, in one process, nothing else running.

    python benchmarks/learner_overhead.py [--model tiny:mini] [--minibatch 32] [--num-minibatches 12]
        [--repeats 5] [--threads 2]

The learner runs twice, without and with `learner.compile` (its warm-up steps, which compile,
printed apart). Ends with `RESULT learner_updates_per_s=... plain_updates_per_s=...
learner_over_plain=... compiled_updates_per_s=... compiled_over_plain=...`.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny:mini", help="tiny:PRESET or an exported HF directory")
    parser.add_argument("--minibatch", type=int, default=32, help="turns per optimizer update")
    parser.add_argument("--num-minibatches", type=int, default=12, help="updates per learner step")
    parser.add_argument("--repeats", type=int, default=5, help="learner steps timed (after one warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from actors.agent_loop import EpisodeTask
    from actors.expert import demonstrations
    from buffer.expansion import expand, to_sequences
    from cluster.local import free_port
    from envs.registry import make_env
    from jobs.aggregate import scored_by_demonstrator
    from jobs.config import load_config
    from jobs.train import JobConfig
    from learner.trainer import Trainer
    from models.loading import ModelConfig, load_tokenizer, resolve_model_dir

    torch.set_num_threads(args.threads)
    job = load_config(JobConfig, "jobs/configs/babyai_mixed_hour.yaml",
                      [f"model.path={args.model}", f"learner.num_minibatches={args.num_minibatches}",
                       f"learner.num_threads={args.threads}"])
    tokenizer = load_tokenizer(job.model)
    num_turns = args.minibatch * args.num_minibatches
    tasks = [EpisodeTask("train", 900_000_000 + i) for i in range(num_turns // 4)]
    trajectories = demonstrations(lambda: make_env(job.env), tasks, tokenizer, job.rollout.loop)
    samples = [s for t in trajectories for s in expand(scored_by_demonstrator(t, job.teachers[0].top_k))][:num_turns]
    assert len(samples) == num_turns, (len(samples), num_turns)
    sequences = to_sequences(samples, packing=job.learner.packing)
    print(f"{num_turns} turns of the bot on the study's level, {sum(s.num_tokens for s in sequences)} tokens", flush=True)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)

    def learner_updates_per_s(config) -> float:
        trainer = Trainer(config, ModelConfig(path=args.model))
        warm = time.perf_counter()
        for _ in range(2):  # warm-up: the second step's shapes differ, which compiles once more
            trainer.train_step(sequences)
        print(f"compile={config.compile}: warm-up {time.perf_counter() - warm:.1f} s", flush=True)
        start = time.perf_counter()
        for _ in range(args.repeats):
            trainer.train_step(sequences)
        return args.repeats * args.num_minibatches / (time.perf_counter() - start)

    learner = learner_updates_per_s(job.learner.model_copy(update={"compile": False}))
    compiled = learner_updates_per_s(job.learner.model_copy(update={"compile": True}))

    # The probe's loop (benchmarks/clone_probe.py sft_step): the same minibatches, one padded pass each.
    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(ModelConfig(path=args.model)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.learner.lr)
    parts = [sequences[i::args.num_minibatches] for i in range(args.num_minibatches)]

    def plain_step(part) -> None:
        width = max(s.num_tokens for s in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, s in enumerate(part):
            ids[i, :s.num_tokens] = torch.tensor(s.token_ids)
            mask[i, :s.num_tokens] = 1
            labels[i, :s.num_tokens] = torch.where(torch.tensor(s.loss_mask), torch.tensor(s.token_ids), -100)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for part in parts:  # warm-up
        plain_step(part)
    start = time.perf_counter()
    for _ in range(args.repeats):
        for part in parts:
            plain_step(part)
    plain = args.repeats * args.num_minibatches / (time.perf_counter() - start)
    dist.destroy_process_group()
    print(f"RESULT learner_updates_per_s={learner:.2f} plain_updates_per_s={plain:.2f} "
          f"learner_over_plain={learner / plain:.2f} compiled_updates_per_s={compiled:.2f} "
          f"compiled_over_plain={compiled / plain:.2f}")


if __name__ == "__main__":
    main()
