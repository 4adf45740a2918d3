"""Worker processes of the CacheX studies and kernels (not a study): the trainer that
``experiments.cachex_durability`` kills, and orbax's emergency ``CheckpointManager`` as a peer.

Usage: HEXAD_CACHEX_TOKEN=... python -m experiments._cachex_faultworker LOCAL PFS HOST PORT N_GOOD
FAULT SEED

The replica server's token comes through the environment (``HEXAD_CACHEX_TOKEN``), never the
command line, where any local user could read it (``ps``, ``/proc/<pid>/cmdline``).

Saves steps ``0 .. N_GOOD-1`` through CacheX to completion, prints ``READY``, then saves step
``N_GOOD``, whose fault hook (:func:`hexad.cachex.kill_at`) SIGKILLs this process at the
point :data:`experiments._cachex.KILL_POINTS` names for ``FAULT``: ``kill_staging`` (before the
T0 copy), ``kill_after_t1`` (after the local write, replica push possibly still running),
``kill_after_replica_ack`` (after the neighbour's ack, before orbax's commit).
:func:`run_killed` runs it from the study.

Also the peer of ``experiments.cachex_bench`` and ``kernels/cachex``: orbax's own multi-tier
checkpointing, ``orbax.checkpoint.experimental.emergency.checkpoint_manager.CheckpointManager``
(a local tier on the non-primary slices, a persistent tier written by the primary slice, a
restore that takes the local copy of any slice that has the step and broadcasts it, else the
persistent one). :class:`EmergencyPeer` runs it as orbax means it to run: two processes of one
``jax.distributed`` job (one CPU device each, gloo collectives, a global mesh with a replica
axis of 2: process 0 is the primary slice and writes the persistent tier, process 1 the other
slice and writes the local tier), started by orbax's public
``multi_tier_checkpointing.initialization.initialize_multi_tier_checkpointing``, and driven
line by line over their stdin (``python -m experiments._cachex_faultworker emergency ...``).

What it needs, and why not one process. In one process every device belongs to process 0,
which is in the primary slice, so the manager writes the persistent tier only: the local tier
is never written (with a 1-slice mesh it is a plain ``CheckpointManager`` on the persistent
directory). With two processes and ``jax.distributed.initialize`` alone, the local slice's
first ``save`` fails in orbax's process-metadata item with ``ValueError: Please call
initialize_distributed_to_device_ids().``: that initializer is public only through
``initialize_multi_tier_checkpointing``, which first hands a ``replicator.yaml`` to GKE's
multi-tier-checkpointing replicator daemon and waits for it to take the file and to leave a
``*.restore`` marker. No such daemon runs here: a thread of each worker stands in for its
handshake only (takes the file, leaves the "no checkpoint" restore marker) and replicates
nothing, so the peer's local tier is not copied to other nodes (its persistent
tier is what survives a lost node). Its restore reads absl flags, so the worker marks absl's
flags parsed. Launch facts come from the environment (``JAX_COORDINATOR_ADDRESS`` and a
Slurm-like ``SLURM_*`` set, which ``jax.distributed.initialize()`` detects).
"""

from __future__ import annotations

import collections
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

_TOKEN_ENV = "HEXAD_CACHEX_TOKEN"


def run_killed(fault: str, local: Path, pfs: Path, address, token: str, n_good: int, seed: int):
    """Runs this worker for ``fault`` against the replica server at ``address``, checks that
    its fault hook SIGKILLed it (RuntimeError otherwise) and gives its drainer 0.3 s."""
    host, port = address
    args = [local, pfs, host, port, n_good, fault, seed]
    cmd = [sys.executable, "-m", "experiments._cachex_faultworker", *map(str, args)]
    env = {**os.environ, _TOKEN_ENV: token}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"{fault}: worker was not killed: {proc.stderr[-2000:]}")
    time.sleep(0.3)  # the killed trainer's orphaned drainer may still persist a step; let it


class EmergencyPeer:
    """orbax's emergency ``CheckpointManager`` in two worker processes (see the module doc).

    Each method sends one command to the workers and returns once they answered (or raises
    ``RuntimeError`` with the tail of their logs after ``timeout_s``). The figures the
    workers measure themselves (``save``'s blocking time, the time from a save's start to its
    commit) come back with the answers; a caller that times a method instead also counts
    one pipe round trip to each worker.

    Args:
      root: a fresh folder: ``local0``, ``local1`` (each process's local tier), ``persistent``
        and the workers' logs.
      mib: the state's size, MiB (4 float32 leaves, replicated on both slices).
      timeout_s: the most any command may take.
    """

    def __init__(self, root: Path, mib: float, *, timeout_s: float = 180.0):
        self.root, self.timeout_s, self.step = Path(root), timeout_s, -1
        self.root.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._procs, self._bufs = [], []
        for pid in range(2):
            env = {
                **os.environ,
                "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
                "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}",
                "SLURM_JOB_ID": str(port),
                "SLURM_STEP_NODELIST": "127.0.0.1",
                "SLURM_NTASKS": "2",
                "SLURM_PROCID": str(pid),
                "SLURM_LOCALID": "0",
            }
            cmd = [sys.executable, "-m", "experiments._cachex_faultworker", "emergency"]
            log = open(self.root / f"worker{pid}.log", "wb")  # noqa: SIM115 (the worker's life)
            proc = subprocess.Popen(
                [*cmd, str(self.root), str(mib)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )  # fmt: skip
            log.close()
            self._procs.append(proc)
            self._bufs.append(b"")
        self._read((0, 1), "ready")

    def _read(self, who, what: str) -> list[list[str]]:
        """The next ``EMX`` answer line of each worker in ``who``, split into words."""
        deadline, out = time.monotonic() + self.timeout_s, []
        for pid in who:
            proc = self._procs[pid]
            while b"\n" not in self._bufs[pid] or not self._bufs[pid].startswith(b"EMX "):
                if b"\n" in self._bufs[pid]:  # a line that is not ours (jax, gloo): skip it
                    self._bufs[pid] = self._bufs[pid].split(b"\n", 1)[1]
                    continue
                left = deadline - time.monotonic()
                ready = select.select([proc.stdout], [], [], max(left, 0))[0] if left > 0 else []
                chunk = os.read(proc.stdout.fileno(), 1 << 16) if ready else b""
                if not chunk:
                    self.close()
                    raise RuntimeError(f"orbax emergency worker {pid}: no answer to {what}: "
                                       f"{self.log_tail(pid)}")  # fmt: skip
                self._bufs[pid] += chunk
            line, self._bufs[pid] = self._bufs[pid].split(b"\n", 1)
            words = line.decode().split()[1:]
            if words[:1] == ["error"]:
                self.close()
                raise RuntimeError(f"orbax emergency worker {pid}: {line.decode()[10:]}")
            out.append(words)
        return out

    def _send(self, who, line: str) -> None:
        for pid in who:
            self._procs[pid].stdin.write(line.encode() + b"\n")
            self._procs[pid].stdin.flush()

    def log_tail(self, pid: int, n: int = 3000) -> str:
        path = self.root / f"worker{pid}.log"
        return path.read_bytes()[-n:].decode(errors="replace") if path.exists() else ""

    def save(self) -> list[float]:
        """Saves the next step on both slices; returns each process's blocking seconds
        (process 0: the persistent tier's save, process 1: the local tier's)."""
        self.step += 1
        self._send((0, 1), f"save {self.step}")
        return [float(w[0]) for w in self._read((0, 1), "save")]

    def wait(self, who=(0, 1)) -> list[float]:
        """``wait_until_finished`` on the processes in ``who``; returns, for each, the seconds
        from its last save's start to its commit (0: persistent-durable, 1: local-durable)."""
        self._send(who, "wait")
        return [float(w[0]) for w in self._read(who, "wait")]

    def lose_local(self) -> None:
        """Every commit finished, then process 1 deletes its local tier (the node's storage is
        lost) and both make their managers again, so that they see the disk as it is; a
        restore now reads the persistent tier. Also checks the last restore (see
        :meth:`check`)."""
        self._send((0, 1), "lose")
        self._read((0, 1), "lose")

    def restore(self) -> float:
        """Both processes restore the last step (its local copy if a slice has it, else the
        persistent one); returns the slower process's seconds, from the restore call to the
        arrays on their devices. :meth:`check` compares them with the saved ones."""
        self._send((0, 1), "restore")
        return max(float(w[0]) for w in self._read((0, 1), "restore"))

    def check(self) -> None:
        """Raises ``RuntimeError`` unless the last restore returned the saved bytes."""
        self._send((0, 1), "check")
        self._read((0, 1), "check")

    def latest(self) -> int:
        """The newest step both processes' managers list (-1: none); the next
        :meth:`restore` reads it. The processes must agree (``RuntimeError`` otherwise)."""
        self._send((0, 1), "latest")
        steps = {int(w[0]) for w in self._read((0, 1), "latest")}
        if len(steps) != 1:
            raise RuntimeError(f"orbax emergency workers list different newest steps {steps}")
        return steps.pop()

    def match(self, newest: int) -> int:
        """The step in ``0 .. newest`` whose state the last restore returned on both
        processes, or -1 when its bytes are no saved step's (a corrupt restore)."""
        self._send((0, 1), f"match {newest}")
        hits = {int(w[0]) for w in self._read((0, 1), "match")}
        return hits.pop() if len(hits) == 1 else -1

    def reopen(self) -> None:
        """Both processes make their managers again, on the disk as it is now."""
        self._send((0, 1), "reopen")
        self._read((0, 1), "reopen")

    def kill(self) -> None:
        """SIGKILLs both workers (a job lost mid-flight); the folders stay as they are."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        self.close()

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    proc.stdin.write(b"quit\n")
                    proc.stdin.flush()
                except OSError:
                    pass
        for proc in self._procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            for f in (proc.stdin, proc.stdout):
                f.close()
        self._procs = []


def emergency_summary(root: Path, mib: float, n_saves: int) -> dict:
    """The ``orbax_emergency_*`` keys of ``experiments.cachex_bench`` (see its docstring):
    ``n_saves`` saves of a ``mib`` MiB state through :class:`EmergencyPeer`, each one started
    once every earlier commit finished, then a restore with the local tier and one after
    losing it; each restore is checked bit-exact. Times are the workers' own. A worker that
    fails is reported in ``orbax_emergency_error`` (the other keys then None); ``root`` is
    removed afterwards."""
    keys = ("stall_ms", "stall_ms_median", "local_durable_s", "persistent_durable_s",
            "restore_local_s", "restore_local_lost_s")  # fmt: skip
    out: dict = {f"orbax_emergency_{k}": None for k in keys}
    out["orbax_emergency_error"] = None
    peer = None
    try:
        peer = EmergencyPeer(root, mib)
        stalls, persistent, local = [], [], []
        for _ in range(n_saves):
            stalls.append(max(peer.save()))  # a lockstep job waits for its slower process
            p_s, l_s = peer.wait()
            persistent.append(p_s)
            local.append(l_s)
        restore_local = peer.restore()
        peer.check()
        peer.lose_local()
        restore_lost = peer.restore()
        peer.check()
        out.update(
            orbax_emergency_stall_ms=1e3 * sum(stalls) / len(stalls),
            orbax_emergency_stall_ms_median=1e3 * _median(stalls),
            orbax_emergency_local_durable_s=_median(local),
            orbax_emergency_persistent_durable_s=_median(persistent),
            orbax_emergency_restore_local_s=restore_local,
            orbax_emergency_restore_local_lost_s=restore_lost,
        )
    except RuntimeError as e:  # reported, not hidden: the study's other figures still stand
        out["orbax_emergency_error"] = str(e)[-2000:]
    finally:
        if peer is not None:
            peer.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


#: The faults of the orbax emergency peer's campaign (``experiments.cachex_durability``):
#: the job SIGKILLed with a save's commit in flight and restarted; the local slice's node
#: storage lost; a bit flipped in, or the second half cut off, the largest file of the newest
#: step of the local tier; a bit flipped in the persistent tier's newest step with the local
#: tier lost; plain files named like steps in every tier's root.
EMERGENCY_FAULTS = (
    "kill_mid_save", "node_lost", "bit_flip_local", "truncated_local", "bit_flip_persistent",
    "stray_entries",
)  # fmt: skip


def _largest_file(folder: Path) -> Path:
    files = [p for p in folder.rglob("*") if p.is_file()]
    if not files:
        raise RuntimeError(f"{folder}: no file to damage")
    return max(files, key=lambda p: p.stat().st_size)


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0xFF
    else:  # truncate
        del data[len(data) // 2 :]
    path.write_bytes(bytes(data))


def emergency_fault_run(fault: str, root: Path, n_good: int, mib: float) -> dict:
    """One run of the peer's campaign: steps ``0 .. n_good-1`` saved and committed on both
    tiers, ``fault`` struck, the newest listed step restored. Returns ``guaranteed`` (the
    newest step committed before the fault: ``n_good - 1``), ``restored`` (the step whose
    exact state came back, -1 for none), ``listed`` (the step the manager offered, -1 for
    none), ``exact``, ``corrupt`` (bytes of no saved step), ``failed`` (the restore raised),
    ``false_claims`` (1 when the step the manager lists does not restore as that step's
    state) and ``error`` (the failure's text, or None)."""
    if fault not in EMERGENCY_FAULTS:
        raise ValueError(f"fault: expected one of {EMERGENCY_FAULTS}, got {fault!r}")
    peer = EmergencyPeer(root, mib)
    out = dict(guaranteed=n_good - 1, restored=-1, listed=-1, exact=0, corrupt=0, failed=0,
               false_claims=0, error=None)  # fmt: skip
    try:
        for _ in range(n_good):
            peer.save()
            peer.wait()
        newest = str(n_good - 1)
        if fault == "kill_mid_save":
            peer.save()  # step n_good: its commit is in flight
            peer.kill()
            peer = EmergencyPeer(root, mib)
        elif fault == "node_lost":
            peer.lose_local()
        elif fault in ("bit_flip_local", "truncated_local"):
            how = "flip" if fault == "bit_flip_local" else "truncate"
            _damage(_largest_file(root / "local1" / newest), how)
            peer.reopen()
        elif fault == "bit_flip_persistent":
            _damage(_largest_file(root / "persistent" / newest), "flip")
            peer.lose_local()
        else:  # stray_entries
            for d in (root / "local0", root / "local1", root / "persistent"):
                (d / str(n_good + 5)).write_bytes(b"not a step\n")
            peer.reopen()
        out["listed"] = peer.latest()
        hit = -1
        if out["listed"] >= 0:
            peer.restore()
            hit = peer.match(n_good)
        out["restored"] = hit
        out["corrupt"] = int(out["listed"] >= 0 and hit < 0)
        out["exact"] = int(hit == max(out["guaranteed"], out["listed"]) and hit >= 0)
        out["false_claims"] = int(out["listed"] >= 0 and hit != out["listed"])
    except RuntimeError as e:  # the restore (or the job) failed: nothing came back
        out.update(failed=1, error=str(e)[-500:])
        out["false_claims"] = int(out["listed"] >= 0)
    finally:
        peer.kill()
        shutil.rmtree(root, ignore_errors=True)
    return out


_EM_KINDS = ("runs", "exact", "corrupt", "failed", "steps_lost", "false_claims")


def emergency_campaign(faults, runs: int, n_good: int, root: Path, ctx) -> dict:
    """The ``orbax_emergency_*`` fault keys of ``experiments.cachex_durability`` (see its
    docstring): ``runs`` runs of :func:`emergency_fault_run` per fault, each logged through
    the study's context ``ctx``, with a 1 MiB state."""
    per: dict = {f: collections.Counter() for f in faults}
    jobs = [(f, i) for f in faults for i in range(runs)]
    for fault, i in ctx.progress(jobs, desc="orbax emergency faults"):
        res = emergency_fault_run(fault, root / f"{fault}-{i}", n_good, 1.0)
        res["steps_lost"] = max(res["guaranteed"] - res["restored"], 0)
        per[fault].update({k: res[k] for k in _EM_KINDS[1:]}, runs=1)
        ctx.log(peer="orbax_emergency", fault=fault, run=i, **res)
    out = {f"orbax_emergency_{f}_{k}": int(c[k]) for f, c in per.items() for k in _EM_KINDS}
    totals = {k: sum(c[k] for c in per.values()) for k in _EM_KINDS}
    out.update(
        orbax_emergency_faults_tried=len(per),
        orbax_emergency_fault_runs=totals["runs"],
        orbax_emergency_steps_lost=totals["steps_lost"],
        orbax_emergency_false_durable_claims=totals["false_claims"],
        orbax_emergency_exact_restores=totals["exact"],
        orbax_emergency_corrupt_restores=totals["corrupt"],
        orbax_emergency_failed_restores=totals["failed"],
    )
    return out


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    return 0.5 * (ys[(len(ys) - 1) // 2] + ys[len(ys) // 2])


_RUN_NAME = "hexad-cachex-bench"


def _stand_in_replicator(local: Path, stop: threading.Event) -> None:
    """The handshake of GKE's replicator daemon, nothing else: takes ``replicator.yaml`` and
    leaves the "no checkpoint" restore marker (an empty ``{job}-s0-n{node}-w0.restore``)."""
    yaml = local / "replicator.yaml"
    while not stop.wait(0.05):
        if yaml.exists():
            fields = dict(ln.split(": ", 1) for ln in yaml.read_text().splitlines() if ": " in ln)
            node = fields["node-rank"].strip()
            (local / f"{_RUN_NAME}-s0-n{node}-w0.restore").write_bytes(b"")
            yaml.unlink()
            return


def _emergency_worker(root: str, mib: str) -> None:
    """One process of :class:`EmergencyPeer`'s job: answers ``save STEP``, ``wait``, ``lose``,
    ``restore``, ``check`` and ``quit`` on stdin with ``EMX ...`` lines on stdout."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import numpy as np
    import orbax.checkpoint as ocp
    from absl import flags
    from orbax.checkpoint.experimental.emergency import checkpoint_manager as em
    from orbax.checkpoint.experimental.emergency.multi_tier_checkpointing import initialization

    flags.FLAGS.mark_as_parsed()  # the emergency restore reads absl flags
    pid = int(os.environ["SLURM_PROCID"])
    root_p = Path(root)
    local, persistent = root_p / f"local{pid}", root_p / "persistent"
    local.mkdir(parents=True, exist_ok=True)
    persistent.mkdir(exist_ok=True)
    stop = threading.Event()
    threading.Thread(target=_stand_in_replicator, args=(local, stop), daemon=True).start()
    initialization.initialize_multi_tier_checkpointing(
        local,
        backup_interval_steps=1,
        num_slices=2,
        run_name=_RUN_NAME,
        use_mtc_process_ids=False,
        jax_initialization_timeout_seconds=120,
        jax_shutdown_timeout_seconds=60,
    )
    stop.set()
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 1), ("replica", "data"))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    n = max(1, int(float(mib) * 2**20 / 4 / 4))
    base = {f"w{i}": np.random.default_rng(i).standard_normal(n, np.float32) for i in range(4)}

    def host(step: int) -> dict:  # step s's state: the base plus s (exact in float32)
        return {k: v + np.float32(step) for k, v in base.items()}

    def device(step: int) -> dict:
        return {k: jax.make_array_from_callback(v.shape, sharding, lambda i, v=v: v[i])
                for k, v in host(step).items()}  # fmt: skip

    def equal(tree, step: int) -> bool:
        return all(np.array_equal(np.asarray(tree[k].addressable_data(0)), v)
                   for k, v in host(step).items())  # fmt: skip

    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, device(0))
    options = em.CheckpointManagerOptions(
        local=em.LocalCheckpointOptions(save_interval_steps=1, max_to_keep=2),
        persistent=em.PersistentCheckpointOptions(save_interval_steps=1, max_to_keep=2),
    )

    def manager():
        return em.CheckpointManager(local, persistent, mesh, abstract, options=options)

    m, started, step, restored = manager(), 0.0, -1, None
    print("EMX ready", flush=True)
    for line in sys.stdin:
        cmd, *arg = line.split()
        try:
            if cmd == "quit":
                break
            if cmd == "save":
                step = int(arg[0])
                tree = device(step)
                started = time.perf_counter()
                m.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(tree)))
                answer = f"{time.perf_counter() - started:.6f}"
            elif cmd == "wait":
                m.wait_until_finished()
                answer = f"{time.perf_counter() - started:.6f}"
            elif cmd == "lose":
                m.wait_until_finished()
                if pid == 1:  # the local slice's node lost its storage
                    for entry in local.iterdir():
                        if entry.is_dir():
                            shutil.rmtree(entry)
                m.close()
                m, answer = manager(), "0"
            elif cmd == "reopen":  # a restarted job's manager, on the disk as it is
                m.close()
                m, answer = manager(), "0"
            elif cmd == "latest":  # the newest step the manager lists; restore reads it next
                latest = m.latest_step()
                step = -1 if latest is None else int(latest)
                answer = str(step)
            elif cmd == "restore":  # the last step saved, or the one "latest" answered
                t0 = time.perf_counter()
                restored = None
                if step >= 0:
                    restored = jax.block_until_ready(m.restore(step).state)
                answer = f"{time.perf_counter() - t0:.6f} {step}"
            elif cmd == "check":
                if restored is None or not equal(restored, step):
                    raise RuntimeError(f"the restore of step {step} returned other bytes")
                answer = "0"
            elif cmd == "match":  # which step's state the last restore returned (-1: none)
                hits = [s for s in range(int(arg[0]) + 1) if restored is not None
                        and equal(restored, s)]  # fmt: skip
                answer = str(hits[0] if hits else -1)
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception as e:  # answered, so that the other side does not hang on us
            print(f"EMX error {type(e).__name__}: {e}".replace("\n", " "), flush=True)
            raise
        print(f"EMX {answer}", flush=True)
    m.close()


def main(argv: list[str]) -> None:
    if argv[:1] == ["emergency"]:
        _emergency_worker(*argv[1:])
        return
    local, pfs, host, port, n_good, fault, seed = argv
    n_good, seed = int(n_good), int(seed)
    token = os.environ.get(_TOKEN_ENV)
    if not token:
        raise SystemExit(f"{_TOKEN_ENV}: expected the replica server's token, got none")
    from experiments._cachex import KILL_POINTS, save_steps
    from hexad import cachex

    if fault not in KILL_POINTS:
        raise SystemExit(f"unknown fault {fault!r}")
    client = cachex.ReplicaClient((host, int(port)), token=token, timeout_s=30)
    hooks = {KILL_POINTS[fault]: cachex.kill_at(n_good)}
    m = cachex.CacheXManager(
        local, neighbour=client, pfs_dir=pfs, max_to_keep=2, seed=seed, fault_hooks=hooks
    )
    save_steps(m, seed, range(n_good))
    print("READY", flush=True)
    save_steps(m, seed, [n_good])
    print("NOT KILLED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
