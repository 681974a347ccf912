"""Publishing learner weights to 4 rollout workers: one object-store put vs pickling and sending
to each worker, for the tiny model and a ~100M-parameter Qwen3, in one run.

Object store: the state dict (as numpy arrays, so readers map it without copying) is put
once and every worker reads the same object and loads it into its model. Baseline: the
state dict is pickled and sent by value to each worker, which unpickles and loads it.
Times are from the first send until every worker has loaded the weights.

    python benchmarks/weight_sync.py [--workers 4]
"""

from __future__ import annotations

import argparse
import pickle
import time

from cluster.local import configure_loopback

configure_loopback()

import ray  # noqa: E402
import torch  # noqa: E402


@ray.remote(num_cpus=0)
class Receiver:
    def __init__(self, config_dict: dict) -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        torch.set_num_threads(1)
        self.model = Qwen3ForCausalLM(Qwen3Config(**config_dict))

    def load_from_store(self, refs: list) -> int:
        arrays = ray.get(refs[0])
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()}, strict=False)
        return len(arrays)

    def load_pickled(self, payload: bytes) -> int:
        state = pickle.loads(payload)
        self.model.load_state_dict(state, strict=False)
        return len(state)


def sync_times(config_dict: dict, num_workers: int) -> tuple[float, float, int]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = Qwen3ForCausalLM(Qwen3Config(**config_dict))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    num_params = sum(v.numel() for v in state.values())
    receivers = [Receiver.remote(config_dict) for _ in range(num_workers)]
    ray.get([r.__ray_ready__.remote() for r in receivers])

    start = time.perf_counter()
    ref = ray.put({k: v.numpy() for k, v in state.items()})
    ray.get([r.load_from_store.remote([ref]) for r in receivers])
    store = time.perf_counter() - start

    start = time.perf_counter()
    payload = pickle.dumps(state)
    ray.get([r.load_pickled.remote(payload) for r in receivers])
    pickled = time.perf_counter() - start
    for r in receivers:
        ray.kill(r)
    return store, pickled, num_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    from cluster.local import init_local_ray
    from learner.models import ModelConfig, resolve_model_dir

    init_local_ray(num_cpus=2)
    try:
        import json

        tiny = json.loads((resolve_model_dir(ModelConfig(path="tiny:tiny")) / "config.json").read_text())
        tiny = {k: v for k, v in tiny.items() if k in ("vocab_size", "hidden_size", "intermediate_size",
                                                          "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "head_dim", "tie_word_embeddings")}
        big = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=10,
                   num_attention_heads=12, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True)
        rows = {}
        for name, cfg in (("tiny", tiny), ("big", big)):
            store, pickled, n = sync_times(cfg, args.workers)
            rows[name] = (store, pickled)
            print(f"{name:>4} ({n / 1e6:6.1f}M params) to {args.workers} workers: object store {store * 1000:8.1f} ms,"
                  f" pickle per worker {pickled * 1000:8.1f} ms, {pickled / store:.2f}x")
        print(f"RESULT tiny_sync_ms={rows['tiny'][0] * 1000:.1f} big_sync_ms={rows['big'][0] * 1000:.1f} "
              f"objstore_over_pickle={rows['big'][1] / rows['big'][0]:.2f}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
