"""The executors: a sweep on worker processes (fake GPUs: CPU processes) or on a local Ray cluster gives the
same verdicts as a plain run, every workload comes back exactly once when workers die, and the
--gpus / --ray options fail in one line."""

from __future__ import annotations

import functools
import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import pytest

from dsactl import executor
from dsactl.errors import DsactlError
from dsactl.executor.host import HostExecutor, _visible, host_gpus
from dsactl.executor.placement import cpu_share, host_cpus
from dsactl.verify import runner
from dsactl.workloads import select
from executor_jobs import always_die, die_once, square, torch_threads

# Small workloads, Triton under the interpreter included (empty rows: milliseconds), and a failing solution.
WORKLOADS = ["hostile-attention-empty-h16-bf16", "hostile-attention-empty-h16-fp8", "hostile-after-topk",
             "hostile-topk-empty-fp32"]
TOPK = "dsa_topk_page_transform_topk2048_ps64"


def _candidates():
    from dsactl import solutions
    from dsactl.solutions import Solution

    broken = Solution("test-drops_index", (TOPK,), "python", "broken_solutions:drops_index", "test", needs_gpu=False)
    chosen = select("hostile", workload_ids=WORKLOADS)
    serving = [s for s in solutions.SOLUTIONS if any(s.serves(w.definition) for w in chosen)]
    return [runner.candidate(s) for s in [*serving, broken]], chosen


def _verdicts(report) -> Counter:
    return Counter((r.solution, r.workload, r.status) for r in report.results)


@pytest.fixture(scope="module")
def local_report():
    cands, chosen = _candidates()
    return runner.verify(cands, chosen, trials=1)


def _exactly_once(done, n):
    assert sorted(d.index for d in done) == list(range(n))


# ---------------------------------------------------------------- fake GPUs: worker processes on the CPU

def test_host_executor_spreads_jobs_over_its_gpus_one_at_a_time_each():
    ex = HostExecutor(["0", "1"])
    try:
        done = list(ex.map(square, list(range(8))))
    finally:
        ex.close()
    _exactly_once(done, 8)
    assert all(d.error is None and d.result[0] == d.index ** 2 for d in done)
    by_gpu: dict[str, list] = {}
    for d in done:
        by_gpu.setdefault(d.result[1], []).append(d.result[2:])
    assert set(by_gpu) == {"0", "1"}, "each worker is pinned to its own GPU"
    for spans in by_gpu.values():
        spans.sort()
        assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), "serial per GPU"


def test_workers_on_the_cpu_have_no_capability_and_size_a_sweep_for_the_interpreter():
    from dsactl.executor.local import LocalExecutor

    ex = HostExecutor(["0", "1"])
    try:
        assert ex.capabilities() == [None, None]
        assert not executor.on_gpus(ex)
    finally:
        ex.close()
    assert LocalExecutor().capabilities() == [None] and not executor.on_gpus(LocalExecutor())


@pytest.mark.gpu
def test_workers_on_a_gpu_report_its_capability():
    import torch

    from dsactl.executor.local import LocalExecutor

    capability = tuple(torch.cuda.get_device_capability(0))
    ex = HostExecutor(["0"])
    try:
        assert ex.capabilities() == [capability] and executor.on_gpus(ex)
    finally:
        ex.close()
    assert LocalExecutor().capabilities() == [capability] and executor.on_gpus(LocalExecutor())


def test_closing_the_host_executor_ends_its_workers_without_waiting_for_their_teardown():
    ex = HostExecutor(["0", "1"])
    try:
        done = list(ex.map(square, list(range(4))))
        pids = [w.warm.result() for w in ex._workers.live]
    finally:
        ex.close()
    _exactly_once(done, 4)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # ended and reaped
    ex.close()  # a second close is a no-op


def test_host_executor_reruns_the_job_of_a_dead_worker(tmp_path):
    ex = HostExecutor(["0", "1"])
    try:
        done = list(ex.map(functools.partial(die_once, str(tmp_path / "died"), square), list(range(5))))
    finally:
        ex.close()
    _exactly_once(done, 5)
    assert all(d.error is None and d.result[0] == d.index ** 2 for d in done)


def test_host_executor_reports_a_job_that_kills_every_worker_once_with_the_reason():
    ex = HostExecutor(["0", "1"], retries=1, restarts=1)
    try:
        done = list(ex.map(always_die, list(range(3))))
    finally:
        ex.close()
    _exactly_once(done, 3)
    assert all(d.result is None and d.placement is None for d in done)
    # four workers (two GPUs, one restart each) and two lost per job: one job finds none left
    died = [d.error for d in done if "died while running it (2 workers lost on it)" in d.error]
    left = [d.error for d in done if d.error.startswith("not run: every worker was lost (last: the worker process")]
    assert (len(died), len(left)) == (2, 1), [d.error for d in done]


def test_a_worker_gets_its_share_of_the_host_cpus():
    assert (cpu_share(16, 4), cpu_share(16.0, 1), cpu_share(3, 8), cpu_share(8, 0)) == (4, 16, 1, 8)
    ex = HostExecutor(["0", "1"])
    try:
        done = list(ex.map(torch_threads, list(range(4))))
    finally:
        ex.close()
    assert [d.result for d in done] == [cpu_share(host_cpus(), 2)] * 4


def test_host_gpus_are_checked_against_the_driver(monkeypatch):
    monkeypatch.setattr("dsactl.device.driver_gpu_count", lambda: 2)
    assert host_gpus(None) == ["0", "1"] and host_gpus(["1"]) == ["1"]
    with pytest.raises(DsactlError, match=r"this host has 2 GPUs \(0-1\), no GPU 2"):
        host_gpus(["0", "2"])
    monkeypatch.setattr("dsactl.device.driver_gpu_count", lambda: 0)
    with pytest.raises(DsactlError, match="no CUDA GPU"):
        host_gpus(None)
    assert host_gpus(["0", "1"]) == ["0", "1"], "without a GPU: CPU workers"


def test_a_pinned_gpu_is_numbered_within_the_visible_ones(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert _visible("1") == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _visible("1") == "1"


@pytest.mark.parametrize("text, message", [("x", "--gpus takes all or GPU indices"), ("0,0", "names a GPU twice"),
                                           ("", "--gpus takes all or GPU indices")])
def test_gpus_option_parsing(text, message):
    with pytest.raises(DsactlError, match=message):
        executor.parse_gpus(text)


def test_verify_through_the_host_executor_gives_the_plain_run_verdicts(local_report):
    cands, chosen = _candidates()
    ex = HostExecutor(["0", "1"])
    try:
        report = runner.verify(cands, chosen, trials=1, executor=ex)
    finally:
        ex.close()
    assert _verdicts(report) == _verdicts(local_report)
    assert [r.workload for r in report.results] == [r.workload for r in local_report.results], "plain run order"
    assert report.skipped == local_report.skipped
    assert all(r.gpu == "cpu" and r.host for r in report.results)


# ---------------------------------------------------------------- a local Ray cluster

@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    # The actors import this file's helpers and broken_solutions by name, as the host workers do.
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error",
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def test_verify_on_ray_gives_the_plain_run_verdicts(local_ray, local_report):
    from dsactl.executor.ray_cluster import RayExecutor

    cands, chosen = _candidates()
    ex = RayExecutor(None)
    try:
        assert ex.describe() == "Ray, 2 actors, one per CPU (the cluster has no GPU: Triton under the interpreter)"
        assert ex.capabilities() == [None, None]
        report = runner.verify(cands, chosen, trials=1, executor=ex)
    finally:
        ex.close()
    assert _verdicts(report) == _verdicts(local_report)
    assert report.count("failed") == 1, "the broken solution fails there as here"
    assert report.skipped == local_report.skipped
    assert all(r.gpu == "cpu" and r.host for r in report.results)


def test_a_gpu_actor_takes_its_nodes_cpus_over_its_gpus(local_ray, monkeypatch):
    from dsactl.executor import placement
    from dsactl.executor.ray_cluster import RayWorker

    given = []
    monkeypatch.setattr(placement, "use_threads", given.append)
    monkeypatch.setattr("dsactl.device.has_cuda_gpu", lambda: True)
    RayWorker._share_node_cpus()
    assert given == [2], "the local cluster: 2 CPUs, no GPU resource (as one)"
    monkeypatch.setattr("dsactl.device.has_cuda_gpu", lambda: False)
    RayWorker._share_node_cpus()
    assert given == [2], "an actor on a CPU keeps the CPU it reserved"


def test_a_ray_actor_killed_mid_run_is_restarted_and_its_workload_rerun(local_ray, tmp_path, local_report):
    from dsactl.executor.ray_cluster import RayExecutor

    cands, chosen = _candidates()
    jobs = [runner.Job(tuple(cands), w, 1, runner.rules.Tolerance(), None, None) for w in chosen]
    ex = RayExecutor(None)
    try:
        done = list(ex.map(functools.partial(die_once, str(tmp_path / "died"), runner.run_job), jobs))
    finally:
        ex.close()
    assert (tmp_path / "died").exists(), "an actor died"
    _exactly_once(done, len(jobs))
    assert all(d.error is None for d in done)
    verdicts = Counter((r.solution, r.workload, r.status) for d in done for r in d.result.results)
    assert verdicts == _verdicts(local_report)


def test_a_ray_run_that_loses_every_actor_reports_each_job_once(local_ray):
    from dsactl.executor.ray_cluster import RayExecutor

    ex = RayExecutor(None, restarts=0, task_retries=0)
    try:
        done = list(ex.map(always_die, list(range(3))))
    finally:
        ex.close()
    _exactly_once(done, 3)
    errors = sorted(d.error for d in done)
    assert all("its Ray actor died while running it" in e for e in errors[:2])
    assert errors[2].startswith("not run: every worker was lost")


# ---------------------------------------------------------------- the command line

def _dsactl(*args, prelude="", env=None):
    code = f"import sys; {prelude}sys.argv = ['dsactl', *{list(args)!r}]; from dsactl.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("args, message", [
    (("--gpus", "zero"), "error: --gpus takes all or GPU indices like 0,1; got 'zero'"),
    (("--gpus", "0", "--ray", "auto"), "error: --gpus and --ray exclude each other"),
])
def test_bad_gpus_or_ray_options_fail_in_one_line(args, message):
    r = _dsactl("verify", "--suite", "hostile", "-w", "hostile-after-topk", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().startswith(message) and len(r.stderr.strip().splitlines()) == 1, r.stderr


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: a connection is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_nothing_answers_at_fails_in_one_line_at_once():
    pytest.importorskip("ray")
    from dsactl.executor.ray_cluster import unreachable

    port = _closed_port()
    assert unreachable(f"127.0.0.1:{port}").startswith(f"nothing answers at 127.0.0.1:{port}")
    assert unreachable(f"ray://127.0.0.1:{port}").startswith("nothing answers")
    assert unreachable("auto") is None and unreachable("headnode") is None
    start = time.monotonic()
    r = _dsactl("verify", "--suite", "hostile", "-w", "hostile-after-topk", "--ray", f"127.0.0.1:{port}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().startswith(f"error: --ray 127.0.0.1:{port}: cannot reach a Ray cluster (nothing "
                                       f"answers at 127.0.0.1:{port}") and len(r.stderr.strip().splitlines()) == 1
    assert time.monotonic() - start < 60, "not Ray's minute of retries"


class _Listener:
    """A local TCP server that accepts every connection and answers it with `reply` (empty: says nothing)."""

    def __init__(self, reply: bytes):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # closed
                return
            with conn:
                if self.reply:
                    conn.sendall(self.reply)
                conn.recv(1024)

    def close(self):
        self.server.close()


def test_an_address_that_answers_but_is_no_ray_cluster_fails_in_one_line_at_once(monkeypatch):
    """A port that accepts connections but is no gRPC server (silent, or another protocol) is refused in
    a second, before Ray's client would retry it for a minute; an HTTP/2 server's SETTINGS passes."""
    pytest.importorskip("ray")
    from dsactl.executor.ray_cluster import SETTINGS_FRAME, unreachable

    for reply in (b"", b"HTTP/1.1 400 Bad Request\r\n\r\n", b"\x00" * 16):
        listener = _Listener(reply)
        try:
            why = unreachable(f"127.0.0.1:{listener.port}", timeout=1)
            assert why == f"127.0.0.1:{listener.port} answers, but is no gRPC server, as Ray's ports are", reply
        finally:
            listener.close()
    tls = _Listener(b"")  # a TLS cluster's handshake comes first: only the connection is tried
    try:
        with monkeypatch.context() as m:
            m.setenv("RAY_USE_TLS", "1")
            assert unreachable(f"127.0.0.1:{tls.port}", timeout=1) is None
    finally:
        tls.close()
    grpc_like = _Listener(bytes([0, 0, 0, SETTINGS_FRAME, 0, 0, 0, 0, 0]))  # an empty SETTINGS frame
    try:
        assert unreachable(f"127.0.0.1:{grpc_like.port}", timeout=1) is None
        assert unreachable(f"ray://127.0.0.1:{grpc_like.port}", timeout=1) is None
    finally:
        grpc_like.close()
    silent = _Listener(b"")
    try:
        start = time.monotonic()
        r = _dsactl("verify", "--suite", "hostile", "-w", "hostile-after-topk", "--ray", f"127.0.0.1:{silent.port}")
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip() == (f"error: --ray 127.0.0.1:{silent.port}: cannot reach a Ray cluster (127.0.0.1:"
                                    f"{silent.port} answers, but is no gRPC server, as Ray's ports are)"), r.stderr
        assert time.monotonic() - start < 60, "not Ray's minute of retries"
    finally:
        silent.close()


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory):
    """A Ray head on this machine that asks every client for a token (Ray's token authentication) and counts
    one GPU, whether or not one is here; and an environment without a token: a HOME with no
    ~/.ray/auth_token and no RAY_AUTH_* variables. Yields (GCS port, token, environment, the raylet's port)."""
    pytest.importorskip("ray")
    if importlib.util.find_spec("ray._private.authentication") is None:
        pytest.skip("this Ray has no token authentication")
    from dsactl.executor.ray_cluster import unreachable

    home = tmp_path_factory.mktemp("home")
    # Its own temp dir: Ray records the last cluster started in the default one, where a later plain
    # ray.init() would try to join it. Short, as Ray's socket paths live under it.
    temp_dir = tempfile.mkdtemp(prefix="dsactl-ray-")
    token, port, node_manager_port = secrets.token_hex(32), _closed_port(), _closed_port()
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    bare["HOME"] = str(home)
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
                             "--num-cpus=1", "--num-gpus=1", "--include-dashboard=false", "--disable-usage-stats",
                             f"--node-manager-port={node_manager_port}",
                             "--block", f"--temp-dir={temp_dir}"],
                            env={**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while unreachable(f"127.0.0.1:{port}", timeout=1) is not None:
            assert head.poll() is None and time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        yield port, token, bare, node_manager_port
    finally:
        head.terminate()
        head.wait(timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_cluster_that_asks_for_a_token_says_how_to_give_it(token_cluster):
    """Ray sends a token to an address given by hand only under RAY_AUTH_MODE=token; without it, with no token
    or with the wrong one, the error says so in one line, at once (not after Ray's twenty seconds of logged
    retries), and with the cluster's token the sweep runs there, on the device its actor has (Ray's GPU count
    is not taken for one)."""
    from dsactl.device import has_cuda_gpu

    port, token, bare, _ = token_cluster
    run = ("verify", "--suite", "hostile", "-w", "hostile-after-topk", "--ray", f"127.0.0.1:{port}")
    cannot = f"error: --ray 127.0.0.1:{port}: cannot reach a Ray cluster ("
    where = "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
    for env, why in [
        (bare, "it asks for a token, which Ray sends to an address given by hand only with RAY_AUTH_MODE=token: "
               f"set it, with the cluster's token in {where}"),
        ({**bare, "RAY_AUTH_MODE": "token"}, f"RAY_AUTH_MODE=token, but this process has no token: give the "
                                             f"cluster's in {where}"),
        ({**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},
         f"it refused this process's token: give the cluster's own in {where}"),
    ]:
        start = time.monotonic()
        r = _dsactl(*run, env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip() == cannot + why, r.stderr
        assert time.monotonic() - start < 15, "refused only after Ray's retries"
    r = _dsactl(*run, env={**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    assert r.returncode == 0, r.stdout + r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("verify: "))
    assert header.endswith("device cuda" if has_cuda_gpu() else "device cpu (no CUDA GPU: Triton runs under the "
                                                                 "interpreter)"), header
    assert "on Ray, 1 actor, one per GPU" in r.stdout and "passed" in r.stdout, r.stdout + r.stderr


def test_a_ray_port_that_is_no_gcs_fails_in_one_line_at_once(token_cluster):
    """Another of Ray's gRPC ports (here the raylet's) given for the cluster's: named as no GCS at once, not
    after ray.init's twenty seconds of logged retries."""
    _, _, bare, node_manager_port = token_cluster
    start = time.monotonic()
    r = _dsactl("verify", "--suite", "hostile", "-w", "hostile-after-topk", "--ray", f"127.0.0.1:{node_manager_port}",
                env=bare)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (f"error: --ray 127.0.0.1:{node_manager_port}: cannot reach a Ray cluster (it answers "
                                "gRPC but serves no Ray GCS: give the head's GCS port (6379 unless `ray start --port` "
                                "said otherwise), or ray://host:10001 for the Ray Client server)"), r.stderr
    assert time.monotonic() - start < 15, "refused only after Ray's retries"


class _RemoteGpus:
    """An executor whose workers report GPUs this process does not have (a Ray cluster joined from a
    laptop); every job it is handed comes back lost, so only what the driver decided shows."""

    local = False

    def __init__(self, capabilities):
        self.found = list(capabilities)

    def capabilities(self):
        return list(self.found)

    def map(self, fn, jobs, started=None):
        for index in range(len(jobs)):
            if started:
                started(index)
            yield executor.Done(index, None, None, error="no such worker")

    def describe(self):
        return f"{len(self.found)} remote workers"

    def close(self):
        pass


def test_the_workers_gpus_not_this_process_size_a_verify_sweep(monkeypatch, capsys):
    """Without a GPU here, a plain run verifies the --quick subset under the interpreter; workers on GPUs
    (Ray from a laptop) get every workload, sized for the GPU, and the report names their device."""
    from dsactl import cli

    def verify_header(workers) -> str:
        monkeypatch.setattr(executor, "choose", lambda gpus, ray: workers)
        monkeypatch.setattr(sys, "argv", ["dsactl", "verify", "--suite", "scale", "-d", "dsa_sparse_attention_h16_*",
                                          "--ray", "auto"])
        with pytest.raises(SystemExit):
            cli.main()
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("verify: "))

    monkeypatch.setattr("dsactl.device.has_cuda_gpu", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    full = len(select("scale", definition="dsa_sparse_attention_h16_*"))
    on_gpus = verify_header(_RemoteGpus([(9, 0), (9, 0)]))
    assert on_gpus.startswith(f"verify: {full} workloads,") and on_gpus.endswith("device cuda"), on_gpus
    on_cpus = verify_header(_RemoteGpus([None, None]))
    assert "(--quick)" in on_cpus and on_cpus.endswith("device cpu (no CUDA GPU: Triton runs under the "
                                                       "interpreter)"), on_cpus


def test_tune_plans_for_its_workers_capability_and_refuses_two(monkeypatch, capsys):
    from dsactl import cli
    from dsactl.tune import sweep

    assert sweep.workers_capability(_RemoteGpus([(9, 0), (9, 0)])) == (9, 0)
    assert sweep.workers_capability(_RemoteGpus([None])) is None
    monkeypatch.setattr("dsactl.device.has_cuda_gpu", lambda: False)
    for found, message in (([None, None], sweep.NO_GPU),
                           ([(9, 0), (10, 0)], "tune: the workers' GPUs differ in compute capability (9.0, 10.0)"),
                           ([(9, 0), None], "tune: the workers' GPUs differ in compute capability (CPU, 9.0)")):
        monkeypatch.setattr(executor, "choose", lambda gpus, ray: _RemoteGpus(found))
        monkeypatch.setattr(sys, "argv", ["dsactl", "tune", "-d", "dsa_sparse_attention_*", "--ray", "auto"])
        with pytest.raises(SystemExit) as exit_:
            cli.main()
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_ray_local_starts_a_cluster_here_whatever_ray_address_names():
    pytest.importorskip("ray")
    dead = f"127.0.0.1:{_closed_port()}"
    r = _dsactl("verify", "--suite", "hostile", "-w", "hostile-after-topk", "--ray", "local",
                env={**os.environ, "RAY_ADDRESS": dead})
    assert r.returncode == 0 and "passed" in r.stdout, r.stdout + r.stderr


def test_ray_option_without_ray_installed_says_how_to_get_it():
    r = _dsactl("bench", "--ray", "auto", prelude="sys.modules['ray'] = None; ")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == "error: --ray needs Ray, which is not installed here: pip install 'dsactl[ray]'"


# ---------------------------------------------------------------- bench through an executor; one file pair per GPU type

BENCH_WORKLOADS = ("edge-topk-len1", "edge-topk-len65", "edge-topk-len2049")
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


class MixedCluster:
    """Jobs run here, but come back out of order from two GPU types; the job at `lose` lost its worker."""

    local = False

    def __init__(self, lose: int | None = None):
        self.lose = lose

    def map(self, fn, jobs, started=None):
        for index in reversed(range(len(jobs))):
            if started:
                started(index)
            if index == self.lose:
                yield executor.Done(index, None, None, "the worker process of GPU 1 died while running it")
                continue
            gpu = (H100, H200)[index % 2]
            yield executor.Done(index, fn(jobs[index]), executor.Placement(gpu, f"GPU-{index % 2}", "node"))

    def describe(self) -> str:
        return "two GPU types"

    def close(self) -> None:
        pass


@pytest.fixture
def cpu_bench(monkeypatch):
    """bench's per-worker timing setup replaced by a fixed timer on the CPU."""
    from dsactl.bench import runner as bench_runner

    def timer(fn, iters, warmup):
        fn()
        return "fake", [1000.0 if iters == bench_runner.REFERENCE_ITERS else 40.0] * iters

    def timing_setup(settings, command):
        return bench_runner._TimingSetup((), {"command": command, "gpu": "worker"}, timer, 1, None, "cpu")

    monkeypatch.setattr(bench_runner, "timing_setup", timing_setup)
    chosen = select("edge", workload_ids=BENCH_WORKLOADS)
    return bench_runner, chosen, bench_runner.Settings(iters=2, trials=1, baselines=["torch-topk"])


def test_bench_through_an_executor_keeps_the_plain_order_and_reports_a_lost_workload(cpu_bench):
    bench_runner, chosen, settings = cpu_bench
    run = bench_runner.bench(chosen, settings, "pytest", executor=MixedCluster(lose=1))
    assert [r.workload for r in run.results] == [BENCH_WORKLOADS[0]] * 2 + [BENCH_WORKLOADS[2]] * 2
    assert {(r.workload, r.gpu, r.gpu_uuid, r.host) for r in run.results} == {
        (BENCH_WORKLOADS[0], H100, "GPU-0", "node"), (BENCH_WORKLOADS[2], H100, "GPU-0", "node")}
    (lost,) = run.failed_solutions()
    assert (lost.name, lost.workload, lost.reason) == (bench_runner.LOST, BENCH_WORKLOADS[1],
                                                       "the worker process of GPU 1 died while running it")
    assert all(r.speedup is not None for r in run.results)


def test_bench_rows_from_two_gpu_types_go_to_one_file_pair_each(cpu_bench, tmp_path, monkeypatch):
    from dsactl.bench import merge, report
    from dsactl.device import gpu_slug

    bench_runner, chosen, settings = cpu_bench
    monkeypatch.setattr("dsactl.device.profiles_dir", lambda name: tmp_path / gpu_slug(name))
    run = bench_runner.bench(chosen, settings, "pytest", executor=MixedCluster())
    written = merge.write(run, "bench-edge", None, None, True)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "h100-80gb-hbm3/bench-edge.csv", "h100-80gb-hbm3/bench-edge.json", "h200/bench-edge.csv", "h200/bench-edge.json"]
    h200 = report.read_csv(tmp_path / "h200" / "bench-edge.csv")
    assert {(r.workload, r.gpu) for r in h200.results} == {(BENCH_WORKLOADS[1], H200)}
    assert report.read_json(tmp_path / "h100-80gb-hbm3" / "bench-edge.json").results[0].gpu == H100
    (everything,) = merge.write(run, "bench-edge", str(tmp_path / "all.csv"), None, False)
    assert len(report.read_csv(everything).results) == len(run.results) == 6
