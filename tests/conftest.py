"""Shared pytest set-up: 8 simulated CPU devices, strict rank promotion, keys, float64 opt-in,
and `fast_compile` (most XLA optimisations off) for tests that mostly compile.

The XLA flag must be set before jax is first imported, so it is set at the top of this file,
which pytest imports before any test module.
"""

import contextlib
import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


def _has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session", autouse=True)
def _checkpoints_in_tmp(tmp_path_factory):
    """Studies run by tests checkpoint under a temporary folder, never the repository's."""
    old = os.environ.get("HEXAD_CHECKPOINTS")
    os.environ["HEXAD_CHECKPOINTS"] = str(tmp_path_factory.mktemp("checkpoints"))
    yield
    if old is None:
        os.environ.pop("HEXAD_CHECKPOINTS", None)
    else:
        os.environ["HEXAD_CHECKPOINTS"] = old


@pytest.fixture
def key():
    """A fixed PRNG key; split it, never reuse it."""
    return jax.random.key(0)


@contextlib.contextmanager
def _x64():
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


@pytest.fixture
def float64():
    """Enable float64 for one test and restore the previous setting afterwards."""
    with _x64():
        yield


@pytest.fixture(scope="module")
def float64_module():
    """Enable float64 for a whole test module (request it from an autouse module fixture)."""
    with _x64():
        yield


@pytest.fixture
def fast_compile():
    """Compile with most XLA optimisations off for one test, then restore the setting.

    For tests dominated by compiling many small programs and running them a few times (the
    studies' smoke tests check keys and ranges, not figures): about half the CPU time.
    """
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
