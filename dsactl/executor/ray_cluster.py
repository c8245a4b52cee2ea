"""A Ray cluster: one actor per GPU (num_gpus=1, so Ray pins each to its own GPU), workloads as actor calls.

Ray places the actors, moves jobs and results through its object store, and restarts an actor that dies
(max_restarts), re-running the call it was in (max_task_retries); a call still lost after that comes back
as failed with Ray's reason. On a cluster without GPUs (CI, a laptop) the actors take a CPU each and run
Triton under the interpreter. Ray is an optional dependency (`pip install 'dsactl[ray]'`), imported only
here and only when --ray is given.
"""

from __future__ import annotations

import os
import socket
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from dsactl.errors import DsactlError
from dsactl.executor import Done, Placement
from dsactl.executor.dispatch import WorkerLost, dispatch

RESTARTS = 2  # times Ray restarts a dead actor
TASK_RETRIES = 1  # times Ray re-runs a call whose actor died (a kernel that kills its process twice is failed)
PING_TIMEOUT_S = 120  # an actor that Ray is restarting answers once it is back
# A cluster address is tried first: Ray's own client retries an address that is silent, or that answers
# but is no Ray cluster, for a minute and then ends the process, where a one-line error is due. Both of
# Ray's ports (the GCS, host:port; the Ray Client server, ray://host:port) are gRPC servers, which answer
# the HTTP/2 client preface with a SETTINGS frame (RFC 9113, 3.4); over TLS (RAY_USE_TLS) only the
# connection is tried, as the handshake comes first there.
CONNECT_TIMEOUT_S = 5
FRAME_HEADER_BYTES = 9
SETTINGS_FRAME = 4  # an HTTP/2 frame header's type byte (its fourth)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, SETTINGS_FRAME, 0, 0, 0, 0, 0])  # + empty SETTINGS


def _first_frame_header(conn: socket.socket) -> bytes:
    """Up to a frame header's bytes of what the server sends back, fewer where it closes first."""
    got = b""
    while len(got) < FRAME_HEADER_BYTES:
        chunk = conn.recv(FRAME_HEADER_BYTES - len(got))
        if not chunk:
            break
        got += chunk
    return got


def unreachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why address's host:port (ray://host:port or host:port) is no Ray cluster to join: nothing answers
    there, or what answers is no gRPC server. None when a gRPC server answers (or the address has no port
    to try: Ray parses and reports it)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    try:
        conn = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except OSError as e:
        return f"nothing answers at {host}:{port}: {e.strerror or e}"
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return None
        try:
            conn.sendall(HTTP2_PREFACE)
            header = _first_frame_header(conn)
        except OSError:  # a timeout, or the connection reset
            header = b""
    if len(header) == FRAME_HEADER_BYTES and header[3] == SETTINGS_FRAME:
        return None
    return f"{host}:{port} answers, but is no gRPC server, as Ray's ports are"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def join_failure(error: BaseException) -> str:
    """Why ray.init could not join, in one line. A join that Ray's token authentication refused is named as
    such: Ray's own line says only that it failed to connect, or what to do in a paragraph, and keeps the
    reason in the text of the error it chains."""
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    if not any(type(e).__name__ == "AuthenticationError" or "AuthenticationError" in str(e) for e in chain):
        return _first_line(error)
    where = "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        # Ray sends a token to an address given by hand only when told to: it would leak to any host named.
        return ("it asks for a token, which Ray sends to an address given by hand only with RAY_AUTH_MODE=token: "
                f"set it, with the cluster's token in {where}")
    if any("no authentication token was found" in str(e) for e in chain):
        return f"RAY_AUTH_MODE=token, but this process has no token: give the cluster's in {where}"
    return f"it refused this process's token: give the cluster's own in {where}"


GRPC_UNIMPLEMENTED = 12  # the status of a call to a service the server does not have


def gcs_refusal(address: str) -> str | None:
    """Why the server at a GCS address (host:port) takes no join, asked with one call of Ray's own client
    before ray.init, which would retry for twenty seconds and log each try: its token authentication
    refuses this process's token (or the lack of one), or it is a gRPC server with no Ray GCS service (another
    of Ray's ports, or another program). None when it answers as a GCS, or the question cannot be asked (a
    ray:// address, or a Ray whose private client API differs): ray.init then finds out for itself."""
    if address.startswith("ray://") or address in ("auto", "local"):
        return None
    try:
        from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError, RpcError
    except ImportError:
        return None
    with _stderr_silenced():  # the native client logs the refusal; the caller says it in one line
        try:
            # As ray.init does first: with RAY_AUTH_MODE=token and no token, Ray's native client ends the process.
            ensure_token_if_auth_enabled(None, create_token_if_missing=False)
            GcsClient(address=address)
        except AuthenticationError as e:
            return join_failure(e)
        except RpcError as e:
            if getattr(e, "rpc_code", None) == GRPC_UNIMPLEMENTED:
                return ("it answers gRPC but serves no Ray GCS: give the head's GCS port (6379 unless "
                        "`ray start --port` said otherwise), or ray://host:10001 for the Ray Client server")
            return None
        except Exception:
            return None
    return None


@contextmanager
def _stderr_silenced() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def import_ray():
    try:
        import ray
    except ImportError:
        raise DsactlError("--ray needs Ray, which is not installed here: pip install 'dsactl[ray]'") from None
    return ray


class RayWorker:
    """The actor: one GPU (or CPU), jobs one at a time. It warms up as it is created (placement.warm_up)."""

    def __init__(self):
        from dsactl.executor.placement import use_interpreter_without_gpu, warm_up

        use_interpreter_without_gpu()
        self._share_node_cpus()
        warm_up()

    @staticmethod
    def _share_node_cpus() -> None:
        """A GPU actor reserves no CPU, so Ray starts it with one thread: give it its node's CPUs over the
        node's GPUs instead (placement.use_threads). An actor on a CPU keeps the one CPU it reserved."""
        import ray

        from dsactl.device import has_cuda_gpu
        from dsactl.executor.placement import cpu_share, use_threads

        if not has_cuda_gpu():
            return
        node = ray.get_runtime_context().get_node_id()
        resources = next((n["Resources"] for n in ray.nodes() if n["NodeID"] == node), {})
        use_threads(cpu_share(resources.get("CPU", 1), int(resources.get("GPU", 1))))

    def ping(self) -> bool:
        return True

    def capability(self) -> tuple[int, int] | None:
        from dsactl.executor.placement import capability

        return capability()

    def run(self, fn: Callable[[Any], Any], job: Any) -> tuple[Any, Placement]:
        from dsactl.executor.placement import here

        return fn(job), here()


class _RayWorkers:
    def __init__(self, ray, gpus: int, actors: int, restarts: int, task_retries: int):
        self.ray = ray
        self.gpus = gpus
        resources = {"num_gpus": 1} if gpus else {"num_cpus": 1}
        self.actor_class = ray.remote(RayWorker).options(**resources, max_restarts=restarts,
                                                         max_task_retries=task_retries)
        self.count = actors
        self.actors: list[Any] = []
        self.started = False

    def start(self) -> list[Any]:
        # Created once and kept for the next map(): more actors than GPUs would wait for a GPU forever.
        if not self.started:
            self.started = True
            self.actors = [self.actor_class.remote() for _ in range(self.count)]
        return list(self.actors)

    def submit(self, actor, fn: Callable[[Any], Any], job: Any):
        return actor.run.remote(fn, job)

    def wait(self, running: list[Any]) -> list[Any]:
        ready, rest = self.ray.wait(running, num_returns=1)
        more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0) if rest else ([], [])
        return ready + more

    def collect(self, actor, future) -> tuple[Any, Placement]:
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(future)
        except exceptions.RayActorError as e:
            raise WorkerLost(f"its Ray actor died while running it, after Ray's retries ({_first_line(e)})") from None
        except exceptions.RayTaskError as e:
            raise e.cause if e.cause is not None else e from None

    def replace(self, actor):
        try:
            self.ray.get(actor.ping.remote(), timeout=PING_TIMEOUT_S)
        except Exception:  # dead for good (restarts used up) or unreachable: its GPU is given up
            self.actors.remove(actor)
            return None
        return actor

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []


class RayExecutor:
    """address: "auto" (the running cluster), "local" (start one on this machine), an address
    (ray://host:10001, host:6379), or None (the cluster this process already joined with ray.init). The
    cluster is joined and the actors are created now (as the host executor starts its workers), so a missing
    install or an unreachable cluster fails before any work and the actors warm up while the command
    selects its workloads."""

    local = False

    def __init__(self, address: str | None = "auto", restarts: int = RESTARTS, task_retries: int = TASK_RETRIES):
        self.ray = import_ray()
        self.address = address
        self.restarts, self.task_retries = restarts, task_retries
        self.owned = False
        self._workers: _RayWorkers | None = None
        self._join().start()

    def _join(self) -> _RayWorkers:
        if self._workers is not None:
            return self._workers
        ray = self.ray
        if not ray.is_initialized():
            if self.address is None:
                raise DsactlError("this process has joined no Ray cluster to run on (ray.init)")
            why = unreachable(self.address)  # None for "auto" and "local": no port to try
            if why:
                raise DsactlError(f"--ray {self.address}: cannot reach a Ray cluster ({why})")
            why = gcs_refusal(self.address)
            if why:
                raise DsactlError(f"--ray {self.address}: cannot reach a Ray cluster ({why})")
            try:
                # "local" as it is: address=None would join a cluster RAY_ADDRESS or Ray's last-cluster file names.
                ray.init(address=self.address, include_dashboard=False,
                         log_to_driver=False, logging_level="error")
            except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
                raise DsactlError(f"--ray {self.address}: cannot reach a Ray cluster ({join_failure(e)})") from None
            self.owned = True
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        self._workers = _RayWorkers(ray, gpus, max(1, gpus or int(resources.get("CPU", 1))), self.restarts,
                                    self.task_retries)
        return self._workers

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any],
            started: Callable[[int], None] | None = None) -> Iterator[Done]:
        # Ray already re-ran a call whose actor died; what comes back lost stays lost.
        return dispatch(self._join(), fn, jobs, 0, started)

    def capabilities(self) -> list[tuple[int, int] | None]:
        workers = self._join()
        actors = workers.start()
        if not workers.gpus:
            return [None] * len(actors)
        try:  # each actor asked: a node's torch may see no GPU where Ray counts one
            return self.ray.get([a.capability.remote() for a in actors], timeout=PING_TIMEOUT_S)
        except Exception as e:  # an actor that cannot start is no worker to size the sweep for
            raise DsactlError(f"the Ray actors did not start ({_first_line(e)})") from None

    def describe(self) -> str:
        workers = self._join()
        kind = "GPU" if workers.gpus else "CPU (the cluster has no GPU: Triton under the interpreter)"
        return f"Ray, {workers.count} actor{'' if workers.count == 1 else 's'}, one per {kind}"

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        if self.owned:
            self.ray.shutdown()
            self.owned = False
