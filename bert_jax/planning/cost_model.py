"""What XLA says of a compiled program: memory per device, its cost model's time, and the bytes
its collectives move, read from `jax.stages.Compiled` (any backend; the TPU compiler's figures are
the ones that say something about a TPU).

Three traps of XLA:TPU's cost model, found by compiling for TPU topologies on a CPU host and
pinned by tests/test_topology.py:
- `optimal_seconds` prices each op it cannot cost (the `rng-bit-generator` of the rbg PRNG, the
  `ConcatBitcast` custom call) at -1 s, so a raw figure can be negative. `ProgramCost.seconds`
  adds back one second per such op in the entry computation and in its loops' bodies.
- A `while` loop's body is priced once, whatever its trip count: the gradient-accumulation loop,
  and the windowed-einsum loops in which the SPMD partitioner overlaps FSDP's all-gathers and
  reduce-scatters with the matmuls (4 to 8 trips; with them a Base step's cycles are 32% more
  than priced). `ProgramCost.seconds` scales the estimate by `loop_factor`: the op cycles the
  compiler estimates (`estimated_cycles`), with every body counted as often as it runs, over the
  same cycles counted once. XLA's FLOPs count loop bodies once too and are scaled alike.
- A `lax.cond` is priced as its dearest branch. The train step applies the optimizer update in
  a branch (`cond(finite, apply_update, skip)`); when the update holds such ops, the skip branch
  looks dearer and the update drops out of the estimate. `compile_check` prices the update on its
  own and adds it back in that case.

All figures are estimates of XLA's cost model, not measurements.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

_UNPRICED = re.compile(r"\brng-bit-generator\(|custom_call_target=\"ConcatBitcast\"")
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = (?P<shape>.+?) "
    r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|collective-permute)"
    r"(?P<start>-start)?\((?P<rest>.*)$"
)
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) .*\{\s*$")
_WHILE = re.compile(r"\bwhile\(.*?condition=%([\w.\-]+), body=%([\w.\-]+)")
_CONSTANT = re.compile(r"\bconstant\((\d+)\)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPCODE = re.compile(r"^\s*(?:ROOT )?%\S+ = .*? ([a-z][a-z-]*)\(")
# Where the step's time goes, by the op's place in the program (its `op_name`), first match wins.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("collectives", r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"),
    ("optimizer update", r"/cond/branch|apply_update|scale_by|adam"),
    ("dropout masks", r"Dropout|dropout"),
    ("layer norm", r"LayerNorm|layer_norm"),
    ("attention matmuls", r"attention/b\w+,b\w+->"),
    ("softmax", r"softmax|reduce_max|/exp$"),
    ("GELU", r"gelu|erf|tanh"),
    ("MLM and NSP heads, loss", r"predictions|seq_relationship|take_along_axis|cls/|log_softmax"),
    ("embeddings", r"embeddings"),
    ("dense matmuls", r"dot_general"),
    ("gradient norm, metrics", r"^jit\(\w+\)/(reduce_sum|sqrt|is_finite|and|add|mul)$"),
)
_ARRAY = re.compile(r"\b(?P<dtype>pred|[subf]\d+|bf16|f8e\w+|c64|c128)\[(?P<dims>[\d,]*)\]")
_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128}


@dataclasses.dataclass(frozen=True)
class Memory:
    """Per-device bytes of a compiled program (XLA's `memory_analysis()`)."""

    argument: int
    output: int
    alias: int  # outputs that reuse donated arguments
    temp: int
    code: int
    reported_peak: int = 0  # the backend's own peak figure, where it gives one (CPU)

    @property
    def peak(self) -> int:
        """Live at once at worst: arguments, outputs not aliased to them, and temporaries (or
        the backend's own figure when larger: CPU's leaves the temporaries out)."""
        return max(self.argument + self.output - self.alias + self.temp, self.reported_peak)


def read_memory(compiled: Any) -> Memory:
    stats = compiled.memory_analysis()
    return Memory(
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        temp=int(stats.temp_size_in_bytes),
        code=int(stats.generated_code_size_in_bytes),
        reported_peak=int(getattr(stats, "peak_memory_in_bytes", 0) or 0),
    )


@dataclasses.dataclass(frozen=True)
class ProgramCost:
    """XLA's cost analysis of one program on one device."""

    flops: float
    bytes_accessed: float
    raw_seconds: float  # `optimal_seconds` as XLA reports it (0 where the backend has none)
    unpriced_ops: int  # ops priced at -1 s, in the entry computation and its loops' bodies
    collective_bytes: dict[str, int]  # per collective kind, see `collective_bytes`
    loop_factor: float = 1.0  # see `loop_factor`: what counting loop bodies once leaves out
    link_bytes: float = 0.0  # sent over the inter-chip links per run, see `link_bytes`

    @property
    def seconds(self) -> float:
        return (self.raw_seconds + self.unpriced_ops) * self.loop_factor

    @property
    def lost_unpriced_ops(self) -> bool:
        """True when ops the model cannot price pushed the raw time to zero or below: a `cond`
        holding this program would have been priced as its other branch."""
        return self.raw_seconds <= 0.0


def read_cost(compiled: Any) -> ProgramCost:
    analysis = compiled.cost_analysis() or {}
    if isinstance(analysis, list | tuple):  # older JAX: one dict per program
        analysis = analysis[0] if analysis else {}
    text = compiled.as_text()
    return ProgramCost(
        flops=float(analysis.get("flops", 0.0)),
        bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
        raw_seconds=float(analysis.get("optimal_seconds", 0.0)),
        unpriced_ops=count_unpriced_ops(text),
        collective_bytes=collective_bytes(text),
        loop_factor=loop_factor(text),
        link_bytes=link_bytes(text),
    )


def entry_computation(hlo_text: str) -> str:
    """The body of the ENTRY computation of an HLO module's text."""
    start = hlo_text.find("\nENTRY ")
    if start < 0:
        return ""
    end = hlo_text.find("\n}", start)
    return hlo_text[start : end if end > 0 else len(hlo_text)]


def computations(hlo_text: str) -> tuple[str, dict[str, list[str]]]:
    """The ENTRY computation's name and every computation's lines, by name."""
    entry, found, current = "", {}, None
    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            current = found.setdefault(match.group(2), [])
            entry = match.group(2) if match.group(1) else entry
        elif current is not None:
            current.append(line)
    return entry, found


def _loops(lines: list[str], found: dict[str, list[str]]) -> list[tuple[str, int]]:
    """(body, trip count) of each while loop among `lines`; the trip count is the largest
    constant its condition compares with (the loops XLA and JAX emit count up from 0)."""
    loops = []
    for line in lines:
        match = _WHILE.search(line)
        if match:
            condition, body = match.groups()
            constants = [
                int(c) for text in found.get(condition, []) for c in _CONSTANT.findall(text)
            ]
            loops.append((body, max(constants, default=1)))
    return loops


def _priced(hlo_text: str) -> tuple[str, dict[str, list[str]], list[str]]:
    """The entry computation and the bodies of its loops (nested loops included): what the
    cost model prices op by op. Fused computations are priced as their fusion; a `cond`'s
    branches are priced as the dearest one (see the module docstring)."""
    entry, found = computations(hlo_text)
    priced, pending = [], [entry] if entry else []
    while pending:
        name = pending.pop()
        if name in found and name not in priced:
            priced.append(name)
            pending += [body for body, _ in _loops(found[name], found)]
    return entry, found, priced


def count_unpriced_ops(hlo_text: str) -> int:
    _, found, priced = _priced(hlo_text)
    return sum(len(_UNPRICED.findall("\n".join(found[name]))) for name in priced)


def loop_factor(hlo_text: str) -> float:
    """The estimated op cycles of the entry computation with every loop body counted as often
    as it runs (nested loops multiply), over the same cycles with each body counted once, as
    the cost model counts them; 1.0 without loops or cycle estimates (CPU)."""
    entry, found, _ = _priced(hlo_text)

    def own(name: str) -> int:
        return sum(int(c) for line in found.get(name, []) for c in _CYCLES.findall(line))

    def cycles(name: str, runs: bool, seen: frozenset = frozenset()) -> int:
        if name in seen:  # a malformed module calling itself: count it no further
            return 0
        loops = _loops(found.get(name, []), found)
        inner = sum(
            (trips if runs else 1) * cycles(body, runs, seen | {name}) for body, trips in loops
        )
        return own(name) + inner

    once = cycles(entry, runs=False) if entry else 0
    return cycles(entry, runs=True) / once if once else 1.0


def array_bytes(shape_text: str) -> list[int]:
    """Bytes of every array in an HLO shape (an array or a tuple of them)."""
    sizes = []
    for match in _ARRAY.finditer(shape_text):
        dtype = match.group("dtype")
        bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype)[:3] or 8)
        dims = [int(d) for d in match.group("dims").split(",") if d]
        sizes.append(math.prod(dims) * bits // 8)
    return sizes


def _collectives(lines: list[str], where: str = ""):
    """(kind, bytes, attributes, key) of each collective among `lines`: the bytes of an
    all-reduce's data, an all-gather's or a permute's result, a reduce-scatter's result; the
    key names its channel (clones inside fusions share one)."""
    for index, line in enumerate(lines):
        match = _COLLECTIVE.match(line)
        if not match:
            continue
        op, rest = match.group("op"), match.group("rest")
        sizes = array_bytes(match.group("shape"))
        if match.group("start") and op in ("all-gather", "collective-permute"):
            size = max(sizes, default=0)  # (operand, result[, contexts]): the result
        else:
            size = sum(sizes)
        channel = re.search(r"channel_id=(\d+)", rest)
        yield op, size, rest, (op, channel.group(1) if channel else f"{where}line{index}")


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes per collective kind in a compiled module, per device: the full buffer each one
    exchanges (an all-reduce's data, an all-gather's gathered result, a reduce-scatter's
    input), every collective counted once (clones inside fusions share its channel id)."""
    found: dict[tuple[str, str], int] = {}
    for op, size, rest, key in _collectives(hlo_text.splitlines()):
        if op == "reduce-scatter":
            size *= _group_size(rest)
        found[key] = max(found.get(key, 0), size)
    totals: dict[str, int] = {}
    for (op, _), moved in found.items():
        totals[op] = totals.get(op, 0) + moved
    return totals


_PARTITIONS = re.compile(r"^HloModule .*?\bnum_partitions=(\d+)")


def link_bytes(hlo_text: str) -> float:
    """Bytes each device sends over the inter-chip links per run of a compiled module, as ring
    algorithms move them over a group of p devices: an all-reduce of N bytes 2N(p-1)/p, an
    all-gather's result or a reduce-scatter's input N(p-1)/p, an all-to-all N(p-1)/p, a
    permute N. A collective inside a loop body counts as often as the body runs.

    XLA's TPU cost model prices a collective as the memory it touches, not as time on the
    links (a 512 MiB all-reduce over 8 v5p chips: 0.46 ms, its HBM traffic), so this is what
    its step time leaves out where the compiler cannot hide a collective behind compute."""
    entry, found = computations(hlo_text)
    header = _PARTITIONS.match(hlo_text)
    everyone = int(header.group(1)) if header else 1  # a group the text does not spell out
    runs: dict[str, int] = {}
    pending = [(entry, 1)] if entry else []
    while pending:
        name, times = pending.pop()
        if runs.get(name, 0) >= times:
            continue
        runs[name] = times
        pending += [(body, times * trips) for body, trips in _loops(found.get(name, []), found)]
    sent: dict[tuple[str, str], float] = {}
    for name, lines in found.items():
        for op, size, rest, key in _collectives(lines, where=f"{name}:"):
            group = _group_size(rest, default=everyone)
            share = (group - 1) / group
            traffic = {
                "all-reduce": 2 * share * size,
                "reduce-scatter": share * size * group,  # its input: the result times p
                "collective-permute": float(size),
            }.get(op, share * size)
            sent[key] = max(sent.get(key, 0.0), traffic * runs.get(name, 1))
    return sum(sent.values())


def _group_size(attributes: str, default: int = 1) -> int:
    """Devices in each replica group of a collective's attributes (`default` when none is
    spelled out)."""
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", attributes)
    if mesh:
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh.group(1)))
        named = re.findall(r"'(\w+)'", mesh.group(2))
        return math.prod(int(sizes.get(axis, 1)) for axis in named) or 1
    iota = re.search(r"replica_groups=\[[\d,]*?(\d+)\]<=", attributes)
    if iota:
        return int(iota.group(1))
    listed = re.search(r"replica_groups=\{\{([\d,]*)\}", attributes)
    if listed:
        return len([d for d in listed.group(1).split(",") if d])
    return default


def cycles_by_category(hlo_text: str) -> dict[str, dict[str, int]]:
    """The TPU compiler's estimated cycles of every op of a compiled module, summed by
    `CATEGORIES` and split into forward / backward / other (the `transpose(jvp(...))` of the
    op's name marks the backward pass): a profile by the cost model, without a chip. Ops a
    backend does not estimate (CPU) leave this empty."""
    found: dict[str, dict[str, int]] = {}
    for line in hlo_text.splitlines():
        cycles = _CYCLES.search(line)
        if not cycles:
            continue
        name_match, opcode_match = _OP_NAME.search(line), _OPCODE.match(line)
        name = name_match.group(1) if name_match else ""
        opcode = opcode_match.group(1) if opcode_match else ""
        category = next(
            (c for c, rule in CATEGORIES if re.search(rule, opcode) or re.search(rule, name)),
            "other (copies, layout, bookkeeping)",
        )
        part = "backward" if "transpose(jvp" in name else "forward" if "jvp(" in name else "other"
        row = found.setdefault(category, {"forward": 0, "backward": 0, "other": 0})
        row[part] += int(cycles.group(1))
    return found
