"""What a `data prepare` run reports: `PrepareResult`, its counts, and the summary line the
command prints (instances, random next shares, rates that add up, the held-out records)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bert_jax.data.preparation.groups import HeldoutCount, InstanceStats
from bert_jax.data.sources import corpus_stats as sources_lib


@dataclass
class PrepareResult:
    output_dir: str
    files: list[str]
    groups_written: int
    groups_skipped: int
    corpus_stats: sources_lib.CorpusStats
    instance_stats: InstanceStats
    wall_seconds: float
    settings: dict = field(default_factory=dict)
    num_workers: int = 0  # the local path's processes (0: a runner's, not known here)
    # The held-out records (``heldout/``; None: none, or none asked for: ``heldout_stats`` None)
    # and what went into them.
    heldout_dir: str | None = None
    heldout_stats: InstanceStats | None = None
    # How many of the corpus's documents were held out, and why (None: not known, as of records
    # an earlier version wrote).
    heldout_count: HeldoutCount | None = None

    @property
    def instances_per_worker_second(self) -> float:
        """Instances per worker CPU second (tokenize + pair + mask + serialize)."""
        if self.instance_stats.cpu_seconds <= 0:
            return 0.0
        return self.instance_stats.instances / self.instance_stats.cpu_seconds

    def summary(self) -> str:
        s = self.instance_stats
        random_share = s.random_next / s.instances if s.instances else 0.0
        forced_share = s.forced_random_next / s.instances if s.instances else 0.0
        pairs = f"random next {random_share:.1%}, forced {forced_share:.1%}"
        instance_format = self.settings.get("instance_format", "sentence_pairs")
        if instance_format != "sentence_pairs":  # no next sentence to be random
            pairs = f"{instance_format}, {self.settings.get('objective', 'mlm')}"
        return (
            f"wrote {self.groups_written} shard(s), skipped {self.groups_skipped} finished "
            f"shard(s) in {self.output_dir}: {s.instances} instances from {s.documents} documents "
            f"({pairs}); {self._rates()}.{self._heldout_summary()} "
            f"Input: {self.corpus_stats.summary()}"
        )

    def _rates(self) -> str:
        """Two rates that add up: instances over the wall time of the whole run (reading
        included), and over the CPU time the workers spent making them."""
        s, wall = self.instance_stats, max(self.wall_seconds, 1e-9)
        workers = f", {self.num_workers} worker(s)" if self.num_workers else ""
        rates = f"{s.instances / wall:.0f} instances/s over {self.wall_seconds:.1f}s wall{workers}"
        if s.cpu_seconds > 0:
            rates += (
                f"; making them (tokenize, pair, mask, serialize) took {s.cpu_seconds:.3g} "
                f"worker CPU-s, {self.instances_per_worker_second:.0f} instances per CPU-second"
            )
        return rates

    def _heldout_summary(self) -> str:
        if self.heldout_stats is None:
            return ""
        held = self.heldout_stats
        if self.heldout_dir is None:
            return " Held out no documents (too few for a share of them: --heldout-share)."
        if not held.instances:
            return f" Held-out records: {self.heldout_dir}, finished before."
        documents = f"{held.documents} documents"
        if self.heldout_count is not None:  # of how many, and why
            documents = self.heldout_count.words(self.settings["heldout_share"])
        return (
            f" Held out {documents}; {held.instances} instances in {held.groups} held-out "
            f"group(s), in {self.heldout_dir}."
        )
