"""Publishing learner weights to 4 rollout workers: one object-store put vs pickling and sending
to each worker, for the tiny model and a ~100M-parameter Qwen3, in one run; then bf16 weights
(the gpu-8 presets' dtype) published as their own bytes (`PublishedWeights`) against the float32
round trip numpy forced before (cast up, put, cast back down in each bf16 engine).

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
    def __init__(self, config_dict: dict, dtype: str = "float32") -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        torch.set_num_threads(1)
        self.model = Qwen3ForCausalLM(Qwen3Config(**config_dict)).to(getattr(torch, dtype))

    def load_from_store(self, refs: list) -> int:
        from models.weights import weights_as_tensors

        state = weights_as_tensors(ray.get(refs[0]))
        self.model.load_state_dict(state, strict=False)
        return len(state)

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


def bf16_publish_times(config_dict: dict, num_workers: int) -> tuple[float, float, int, int]:
    """(seconds, seconds, bytes, bytes) to publish bf16 weights to bf16 receivers: as their own
    bytes, and through a float32 round trip."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from models.weights import PublishedWeights

    model = Qwen3ForCausalLM(Qwen3Config(**config_dict)).to(torch.bfloat16)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    receivers = [Receiver.remote(config_dict, "bfloat16") for _ in range(num_workers)]
    ray.get([r.__ray_ready__.remote() for r in receivers])
    times, sizes = [], []
    for publish in (PublishedWeights.from_state_dict, lambda sd: {k: v.float().numpy() for k, v in sd.items()}):
        start = time.perf_counter()
        weights = publish(state)
        ref = ray.put(weights)
        ray.get([r.load_from_store.remote([ref]) for r in receivers])
        times.append(time.perf_counter() - start)
        arrays = weights.arrays if isinstance(weights, PublishedWeights) else weights
        sizes.append(sum(a.nbytes for a in arrays.values()))
        del ref
    for r in receivers:
        ray.kill(r)
    return times[0], times[1], sizes[0], sizes[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    from cluster.local import init_local_ray
    from models.loading import ModelConfig, resolve_model_dir

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
        bf16_s, roundtrip_s, bf16_bytes, roundtrip_bytes = bf16_publish_times(big, args.workers)
        print(f" big in bf16 to {args.workers} bf16 workers: own bytes {bf16_s * 1000:8.1f} ms "
              f"({bf16_bytes / 2**20:.0f} MiB), float32 round trip {roundtrip_s * 1000:8.1f} ms "
              f"({roundtrip_bytes / 2**20:.0f} MiB), {roundtrip_s / bf16_s:.2f}x")
        print(f"RESULT tiny_sync_ms={rows['tiny'][0] * 1000:.1f} big_sync_ms={rows['big'][0] * 1000:.1f} "
              f"objstore_over_pickle={rows['big'][1] / rows['big'][0]:.2f} bf16_sync_ms={bf16_s * 1000:.1f} "
              f"fp32_roundtrip_over_bf16={roundtrip_s / bf16_s:.2f} bytes_ratio={roundtrip_bytes / bf16_bytes:.2f}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
