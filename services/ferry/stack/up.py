"""``ferry up``: Redis, Triton, a gateway and a batcher on loopback, stopped together."""

from __future__ import annotations

import dataclasses
import secrets
import signal
import sys
import threading
from importlib import resources
from pathlib import Path
from types import FrameType

from ferry.errors import StartupError
from ferry.settings import BatcherSettings, GatewaySettings, UpSettings, to_env
from ferry.settings.services import LoggerSettings
from ferry.stack.banner import banner, first_request, model_config_text
from ferry.stack.ports import LOOPBACK, claim, free_port, http_ok, is_listening
from ferry.stack.process import ManagedProcess, env_with
from ferry.stack.redis_server import start_redis
from ferry.stack.state import (
    ADMIN_TOKEN_FILE,
    REDIS_ENV_FILE,
    REDIS_KEPT,
    REDIS_URL_FILE,
    TRITON_URL_FILE,
)
from ferry.stack.triton_server import start_triton

DEFAULT_JOB_STORE = GatewaySettings.job_store_dir  # ferry up keeps jobs' files in its state dir
DEFAULT_LOG_SINK = LoggerSettings.log_sink  # ... and the inference log's files


def bundled_repository() -> Path:
    """The model repository that ships with Ferry (moderation, sim)."""
    return Path(str(resources.files("ferry") / "model_repository"))


def sample_image() -> Path:
    return Path(str(resources.files("ferry") / "samples" / "grace_hopper.jpg"))


def samples_source() -> str:
    """The job source ``ferry up`` allows when none is set: the samples shipped with Ferry (a
    public-domain photo), so that docs/jobs.md's ``uri`` item runs as written. A gateway
    deployed otherwise reads no URI until its operator allowlists a root."""
    return sample_image().parent.as_uri() + "/"


def repository_models(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if (p / "config.pbtxt").is_file())


FIRST_REQUEST_FILE = "first-request.json"  # a tensor-form body too long for the banner


def admin_token(state: Path) -> str:
    """The local stack's admin token: kept in ``<state>/admin-token`` (made on first use,
    readable by its owner only), so ``ferry rollout`` on this machine finds it."""
    path = state / ADMIN_TOKEN_FILE
    if path.exists():
        return path.read_text().strip()
    state.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return token


class LocalStack:
    """Starts the pieces in order, stops them in reverse, and watches them in between."""

    def __init__(self, settings: UpSettings) -> None:
        self.settings = settings
        self.state = Path(settings.state_dir).resolve()
        self.logs = self.state / "logs"
        self.processes: list[ManagedProcess] = []
        self._stop = threading.Event()
        self._interrupted = False  # stopped by Ctrl-C (SIGINT), not SIGTERM

    def run(self) -> int:
        """Start everything, print how to use it, wait for Ctrl-C or a crash, stop everything.
        Its exit code: 0 once stopped as asked (Ctrl-C or SIGTERM), 1 if a piece failed.
        A stop that was asked for is no failure: as a service under systemd or Kubernetes
        ends 0 after a graceful shutdown, and as ``make up`` must not report an error."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        try:
            code = self._serve()
            if self._interrupted and code == 0:
                print("ferry up: interrupted; stopping ...", file=sys.stderr, flush=True)
            return code
        finally:
            self.stop()

    def _serve(self) -> int:
        try:
            settings = self._start_all()
            print(self._banner(settings, self._repository()), flush=True)
            return self._watch()
        except StartupError as exc:
            if self._interrupted:  # a start cut short by Ctrl-C is no failure
                return 0
            print(f"ferry up: {exc}", file=sys.stderr)
            return 1

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self._stop.is_set():  # the first signal tells what stops it
            self._interrupted = signum == signal.SIGINT
        self._stop.set()

    def _start_all(self) -> UpSettings:
        s = self.settings
        for port, option in ((s.port, "--port"), (s.grpc_port, "--grpc-port")):
            if port and is_listening(s.host, port):
                raise StartupError(f"port {port} on {s.host} is in use; pick another with "
                                   f"{option}")
        claim(s.port, s.grpc_port, s.metrics_port, s.log_metrics_port)  # nothing below picks these
        repository = self._repository()
        redis_url = s.redis_url or self._start_redis()
        triton_url, triton_http_url = s.triton_url, s.triton_http_url
        if not triton_url:  # Triton started here: infer calls over its HTTP, the cheaper plane
            triton_url, started_http = self._start_triton(repository)
            triton_http_url = triton_http_url or started_http
        default_model = self._default_model(repository)
        resolved = dataclasses.replace(
            s, redis_url=redis_url, triton_url=triton_url, triton_http_url=triton_http_url,
            default_model=default_model, metrics_port=s.metrics_port or free_port(),
            log_metrics_port=(s.log_metrics_port or free_port()) if s.log_rates else 0,
            log_sink=(str(self.state / "inference-log") if s.log_sink == DEFAULT_LOG_SINK
                      else s.log_sink),
            admin_token=s.admin_token or admin_token(self.state),
            job_sources=s.job_sources or samples_source(),
            job_store_dir=(str(self.state / "jobs") if s.job_store_dir == DEFAULT_JOB_STORE
                           else s.job_store_dir))
        self._start_service("batcher", to_env(resolved, BatcherSettings))
        self._save(REDIS_URL_FILE, resolved.redis_url)
        defaults = {f.name: f.default for f in dataclasses.fields(UpSettings)}
        self._save(REDIS_ENV_FILE, "\n".join(
            f"FERRY_{name.upper()}={getattr(resolved, name)}" for name in REDIS_KEPT
            if getattr(resolved, name) != defaults[name]))
        self._save(TRITON_URL_FILE, resolved.triton_url)
        self._start_logger(resolved)
        gateway = self._start_service("gateway", to_env(resolved, GatewaySettings))
        gateway.wait_ready(lambda: http_ok(f"http://{s.host}:{s.port}/readyz"), 120,
                           self._stop.is_set)
        return resolved

    def _save(self, name: str, url: str) -> None:
        """Where the client commands on this machine find the stack's Redis (``ferry log
        tail``) and its Triton (``ferry plan fit``): ``ferry.stack.state``."""
        self.state.mkdir(parents=True, exist_ok=True)
        saved = self.state / name
        saved.touch(mode=0o600)  # a URL may hold a password
        saved.write_text(url + "\n")

    def _start_logger(self, s: UpSettings) -> None:
        """With ``log_models``, the inference log's logger (``s`` resolved: its files in the
        state directory unless ``log_sink`` names a place; its /metrics on the port given,
        else a free one)."""
        if s.log_rates:
            self._start_service("logger", to_env(s, LoggerSettings))

    def _repository(self) -> Path:
        s = self.settings
        return Path(s.model_repository) if s.model_repository else bundled_repository()

    def _default_model(self, repository: Path) -> str:
        models = repository_models(repository) if repository.is_dir() else []
        if self.settings.triton_url or self.settings.default_model in models or not models:
            return self.settings.default_model
        return models[0]

    def _start_redis(self) -> str:
        print("starting redis-server ...", flush=True)
        proc, url = start_redis(self.state / "redis", persist=True,
                                interrupted=self._stop.is_set)
        self.processes.append(proc)
        return url

    def _start_triton(self, repository: Path) -> tuple[str, str]:
        """Start tritonserver; its gRPC and HTTP addresses."""
        print(f"starting tritonserver on {repository} ...", flush=True)
        proc, ports = start_triton(repository.resolve(), self.state / "triton",
                                   interrupted=self._stop.is_set)
        self.processes.append(proc)
        return f"{LOOPBACK}:{ports.grpc}", f"{LOOPBACK}:{ports.http}"

    def _start_service(self, name: str, env: dict[str, str]) -> ManagedProcess:
        print(f"starting {name} ...", flush=True)
        proc = ManagedProcess(name, [sys.executable, "-m", "ferry", name], env=env_with(env),
                              log_path=self.logs / f"{name}.log")
        proc.start()
        self.processes.append(proc)
        return proc

    def _watch(self) -> int:
        while not self._stop.wait(0.5):
            for proc in self.processes:
                if not proc.running():
                    print(f"ferry up: {proc.name} exited with code {proc.returncode()}; "
                          f"see {proc.log_path}; stopping", file=sys.stderr)
                    return 1
        if not self._interrupted:
            print("\nstopping ...", flush=True)
        return 0

    def stop(self) -> None:
        """Stop in reverse start order: gateway, batcher (drains), Triton, Redis; then forget
        the addresses kept for the client commands (nothing answers at them any more)."""
        # A batcher may take its grace for the loops and half again for batches.
        grace = max(15.0, 2 * self.settings.shutdown_grace_s)
        while self.processes:
            proc = self.processes.pop()
            proc.stop(grace_s=grace)
        for name in (REDIS_URL_FILE, REDIS_ENV_FILE, TRITON_URL_FILE):
            (self.state / name).unlink(missing_ok=True)

    def _banner(self, s: UpSettings, repository: Path) -> str:
        """The banner, with a first request for the default model as its config in the
        repository asks (a Triton started elsewhere: its models' configs are not at hand)."""
        config = None if self.settings.triton_url else model_config_text(repository,
                                                                          s.default_model)
        request = first_request(f"http://{s.host}:{s.port}", s.default_model, config,
                                sample_image(), self.state / FIRST_REQUEST_FILE)
        if request.body:
            (self.state / FIRST_REQUEST_FILE).write_bytes(request.body)
        return banner(s, self.logs, self.state / ADMIN_TOKEN_FILE, request)
