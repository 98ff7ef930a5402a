"""XLA flags for test processes (the pytest workers and the processes the tests start).

The tests compile many tiny programs and run each for a few steps: LLVM's optimization level 0
takes about a third less compile time (same HLO and fusions; losses agree to ~1e-7). Nothing here
imports JAX, so a child process can read it before it sets its own device count.
"""

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def with_devices(count: int) -> str:
    return f"--xla_force_host_platform_device_count={count} {TEST_XLA_FLAGS}"
