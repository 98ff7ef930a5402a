"""XLA flags for test processes (the pytest workers and the processes the tests start).

The tests compile many tiny programs and run each for a few steps: LLVM's optimization level 0
takes about a third less compile time (same HLO and fusions; losses agree to ~1e-7). The CPU
backend's MLIR fusion emitters spend most of what is left compiling each fusion through an MLIR
pass pipeline; the older LLVM IR emitters (`--xla_cpu_use_fusion_emitters=false`) compile the same
fusions in about a third less CPU time (the tiny train step: 14-16 s -> 10 s of CPU per process;
the losses of 30 steps agree to the last printed digit). LLVM code generation in one piece
(`--xla_cpu_parallel_codegen_split_count=1`) skips splitting and cloning each module into parts
for threads that, with two test workers on two cores, have no core to run on: the sharded train
step of test_partitioning compiles in 1.30-1.58 s of CPU time instead of 1.56-1.91 s (medians of
7, three alternating rounds). Nothing here imports JAX, so a child process can read it before it
sets its own device count.
"""

TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    " --xla_cpu_parallel_codegen_split_count=1"
)


def with_devices(count: int) -> str:
    return f"--xla_force_host_platform_device_count={count} {TEST_XLA_FLAGS}"
