"""The training loops and chain runners that take a mesh, on a 4-device data mesh spanning the
2 processes of a ``jax.distributed`` job (2 host CPU devices each, loopback, gloo): the same
results as one process on a 4-device mesh, each process loading only its rows of a batch
(``hexad.sharding.from_process_rows``). The worker is tests/_dist_families.py.

Families: RWEFM's trainer (``init`` on the host batch, its state then replicated over the
mesh; the step on each process's clouds), Pref-MH's chain runner, the offline-RL trainer
(``policy.make_train``, BC), the PoE/KL composition (``policy.compose``, jitted over a batch of
states), the backdoor trainer (``backdoor.fit``), DTB's implant (``backdoor.implant`` with a
mesh: each step's outer and clean rows split) and the fine-tuning defenses (FT on a
``DefenseData`` whose rows each process holds its part of: ``minimize``'s minibatches follow
the data's placement).
About 2 minutes beside another job on 2 cores (two compiles of each family), so it runs in
``make test``.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np

from tests import _jobs

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("_dist_families.py")
FAMILIES = ("rwefm", "prefmh", "policy", "compose", "backdoor", "dtb", "defense")
# Chains and the composition are elementwise over rows: bit-equal. Trainers all-reduce their
# gradients over 4 devices in another order across processes: measured at most 6e-8 absolute
# (parameters of size up to 1.2) after 3 steps; 1e-6 leaves room for another CPU's kernels.
ATOL = 1e-6


def _run(tmp_path: Path, processes: int) -> dict:
    out = tmp_path / f"p{processes}.npz"
    port, procs = _jobs.port(), []
    for i in range(processes):
        env = _jobs.env() if processes == 1 else _jobs.env(
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
            JAX_PROCESS_ID=str(i), HEXAD_DISTRIBUTED_TIMEOUT_S="60")  # fmt: skip
        log = open(tmp_path / f"p{processes}-{i}.log", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen([sys.executable, str(SCRIPT), str(out), *FAMILIES],
                                       stdout=log, stderr=subprocess.STDOUT, env=env,
                                       cwd=ROOT), log))  # fmt: skip
    try:
        codes = [p.wait(timeout=300) for p, _ in procs]
    finally:
        for p, log in procs:
            p.kill()
            log.close()
    logs = [(tmp_path / f"p{processes}-{i}.log").read_text()[-1500:] for i in range(processes)]
    assert codes == [0] * processes, logs
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def test_two_processes_give_the_one_process_results(tmp_path):
    one, two = _run(tmp_path, 1), _run(tmp_path, 2)
    assert int(one["processes"]) == 1 and int(two["processes"]) == 2
    for f in FAMILIES:
        keys = sorted(k for k in one if k.startswith(f"{f}/") and k != f"{f}/held_rows")
        assert keys and keys == sorted(k for k in two if k.startswith(f"{f}/") and
                                       k != f"{f}/held_rows")  # fmt: skip
        for k in keys:
            np.testing.assert_allclose(two[k], one[k], rtol=0, atol=ATOL, err_msg=k)
    # batches loaded per process: each of the 2 holds 8 of the 16 rows (one process: all 16)
    for f in ("rwefm", "prefmh", "compose", "defense"):
        assert int(one[f"{f}/held_rows"]) == 16 and int(two[f"{f}/held_rows"]) == 8
