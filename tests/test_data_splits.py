"""Inputs as splits: every byte read once, by one split, and the documents iter_documents gives.

Each source kind is cut into one split, two and many (``target_bytes`` from the source's size);
the splits read together give iter_documents' documents (sorted by key) and its counts, and the
bytes read from storage are the input's bytes (a Parquet file: every chunk of its text column),
with the planning probes and each split's footer or header counted apart.
"""

from __future__ import annotations

import bz2
import gzip
import json
import os

import pytest

from bert_jax.data.sources import splits
from bert_jax.data.sources.corpus_stats import CorpusStats
from bert_jax.data.sources.documents import read_documents
from bert_jax.runtime.errors import UserError
from tests.corpus_fixtures import (
    wikipedia_dump_xml,
    write_cut_anywhere_bz2,
    write_parquet,
    write_stream_per_page_bz2,
)


def _text_corpus() -> bytes:
    """Original-format text with what the reader must count the same on both sides of a cut:
    runs of blank lines (empty documents), whitespace-only blank lines, a line of bad bytes and
    an over-long line, inside documents."""
    lines = []
    for i in range(60):
        lines += [b"Document %d sentence %d." % (i, j) for j in range(1 + i % 4)]
        if i % 7 == 3:
            lines.append(b"Bad bytes \xff\xfe in document %d." % i)
        if i % 11 == 5:
            lines.append(b"x" * 300)
        lines.append(b"" if i % 5 else b"\n \t")  # every fifth: blank, whitespace-only, blank
        if i % 9 == 8:
            lines.append(b"")  # a second blank line: an empty document
    return b"\n".join(lines) + b"\n"


def _jsonl_corpus() -> bytes:
    lines = []
    for i in range(80):
        if i % 13 == 4:
            lines.append("{not json")
        elif i % 17 == 6:
            lines.append(json.dumps({"text": "   "}))  # an empty document
        elif i % 19 == 7:
            lines.append("")
        elif i % 10 == 9:
            lines.append(json.dumps({"text": "y" * 300}))  # over-long: skipped and counted
        else:
            lines.append(json.dumps({"text": f"Record {i} begins. It has two sentences."}))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """One file of each kind that is read by ranges."""
    root = tmp_path_factory.mktemp("splits")
    text = root / "books.txt"
    text.write_bytes(_text_corpus())
    jsonl = root / "web.jsonl"
    jsonl.write_bytes(_jsonl_corpus())
    table = root / "rows.parquet"
    rows = [f"Row {i} opens. It closes here." for i in range(40)]
    rows[5], rows[17] = None, "  "  # a null (bad record) and an empty document
    write_parquet(table, rows, row_group_size=4)  # ten row groups
    dump = root / "enwiki-20240501-pages-articles-multistream1.xml.bz2"
    write_stream_per_page_bz2(dump, wikipedia_dump_xml(repeat=4))  # 28 pages, a stream each
    return {"text": text, "jsonl": jsonl, "parquet": table, "wikipedia": dump}


def _read_all(plan, **options):
    """Every split read apart (as workers would): documents with keys, the merged counts, the
    bytes read."""
    keyed, stats, count = [], CorpusStats(), splits.ByteCount()
    for split in plan:
        split_stats, split_count = CorpusStats(), splits.ByteCount()
        keyed.extend(splits.read_split(split, split_stats, byte_count=split_count, **options))
        stats.merge(split_stats)
        count.add(split_count)
    return keyed, stats, count


def _counts(stats: CorpusStats) -> dict:
    return {k: v for k, v in stats.as_dict().items() if k != "problems"}


def _parquet_layout(path):
    """(bytes of the text column's chunks, footer bytes read per split: the footer and the
    8 bytes after it)."""
    import pyarrow.parquet as pq

    metadata = pq.read_metadata(path)
    chunks = sum(
        metadata.row_group(g).column(0).total_compressed_size
        for g in range(metadata.num_row_groups)
    )
    footer = os.path.getsize(path) - 4 - chunks  # the leading magic, then the chunks
    return chunks, footer


@pytest.mark.parametrize("kind", ["text", "jsonl", "parquet", "wikipedia"])
@pytest.mark.parametrize("pieces", ["one", "two", "many"])
def test_splits_read_every_byte_once_and_give_iter_documents_documents(corpora, kind, pieces):
    path = str(corpora[kind])
    size = splits.split_bytes(splits.cut_splits([path], target_bytes=1 << 40)[0])
    target = {"one": size, "two": (size + 1) // 2, "many": max(1, size // 8)}[pieces]
    probes = splits.ByteCount()
    plan = splits.cut_splits([path], target_bytes=target, byte_count=probes)

    expected_splits = {"one": 1, "two": 2}.get(pieces)
    assert len(plan) == expected_splits if expected_splits else len(plan) >= 5
    assert plan == splits.cut_splits([path], target_bytes=target)  # deterministic
    assert all(s.kind == kind and s.source == path and s.source_index == 0 for s in plan)
    assert plan[0].start == 0 and all(a.stop == b.start for a, b in zip(plan, plan[1:]))
    assert sum(splits.split_bytes(s) for s in plan) == size

    keyed, stats, count = _read_all(plan, max_line_bytes=200)
    keys = [key for key, _ in keyed]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    documents, expected_stats = read_documents([path], max_line_bytes=200)
    assert [document for _, document in keyed] == documents
    assert _counts(stats) == _counts(expected_stats)
    assert len(stats.problems) == len(expected_stats.problems)
    if pieces == "one":
        assert stats.problems == expected_stats.problems

    file_bytes = os.path.getsize(path)
    if kind == "parquet":
        chunks, footer = _parquet_layout(path)
        assert (count.content, count.extra) == (chunks, footer * len(plan))
        assert probes.extra == footer
    else:
        assert count.content == file_bytes  # every byte once
        cut_points = -(-file_bytes // target) - 1
        if kind == "wikipedia":
            # A later split reads the header's stream besides its own: 1 KiB, the first block.
            assert count.extra == (len(plan) - 1) * 1024
        else:
            assert count.extra == 0
            # Each probe's first block finds a boundary: these documents are short.
            assert probes.extra <= cut_points * splits._PROBE_BLOCK


def test_keys_do_not_depend_on_the_cut(corpora):
    sources = [str(path) for path in corpora.values()]
    plans = [splits.cut_splits(sources, target_bytes=t) for t in (1 << 40, 700, 90)]
    assert len(plans[0]) == 4 and len(plans[1]) < len(plans[2])
    keyed = [_read_all(plan)[0] for plan in plans]
    assert keyed[0] == keyed[1] == keyed[2]
    assert [key[0] for key, _ in keyed[0]] == sorted(key[0] for key, _ in keyed[0])
    assert [document for _, document in keyed[0]] == read_documents(sources)[0]


def test_sources_read_whole_are_one_split(tmp_path, corpora):
    plain = tmp_path / "notes.txt.gz"
    with gzip.open(plain, "wb") as f:
        f.write(_text_corpus())
    records = tmp_path / "web.jsonl.gz"
    with gzip.open(records, "wb") as f:
        f.write(_jsonl_corpus())
    xml = tmp_path / "enwiki-small.xml"
    xml.write_text(wikipedia_dump_xml(repeat=2), encoding="utf-8")
    single = tmp_path / "enwiki-single.xml.bz2"
    single.write_bytes(bz2.compress(wikipedia_dump_xml(repeat=2).encode()))
    pbzip2 = tmp_path / "enwiki-pbzip2.xml.bz2"
    write_cut_anywhere_bz2(pbzip2, wikipedia_dump_xml(repeat=2))
    sources = [str(p) for p in (plain, records, xml, single, pbzip2)] + ["embedded:eval"]

    plan = splits.cut_splits(sources, target_bytes=64)
    kinds = ["text", "jsonl", "wikipedia", "wikipedia", "wikipedia", "embedded"]
    assert [(s.source_index, s.kind, s.start, s.stop) for s in plan] == [
        (i, kind, 0, -1) for i, kind in enumerate(kinds)
    ]
    keyed, stats, count = _read_all(plan, max_line_bytes=200)
    documents, expected_stats = read_documents(sources, max_line_bytes=200)
    assert [document for _, document in keyed] == documents
    assert stats.as_dict() == expected_stats.as_dict()
    assert [key for key, _ in keyed] == sorted(key for key, _ in keyed)
    assert count.content == sum(os.path.getsize(p) for p in sources[:-1])
    assert splits.split_bytes(plan[-1]) == 0


@pytest.mark.parametrize("name", ["lines.txt", "records.jsonl"])
def test_a_file_is_empty_only_when_no_split_reads_a_line(tmp_path, name):
    """Over-long lines are skipped: a file of nothing else counts as empty; one that starts
    with them does not, however small its splits."""
    path = tmp_path / name
    long_line = b"z" * 80 + b"\n"
    for content in (long_line * 3, long_line * 3 + b'{"text": "One. Two."}\n\n' * 4):
        path.write_bytes(content)
        expected = read_documents([path], max_line_bytes=50)
        for target in (1, 10, 1 << 20):
            plan = splits.cut_splits([path], target_bytes=target, max_line_bytes=50)
            keyed, stats, count = _read_all(plan, max_line_bytes=50)
            assert [document for _, document in keyed] == expected[0]
            assert stats.as_dict() == expected[1].as_dict() and count.content == len(content)


def test_bad_input_in_a_later_split_names_the_file_and_the_lines_byte(tmp_path):
    path = tmp_path / "bad.txt"
    good = b"".join(b"Document %d.\nIts second line.\n\n" % i for i in range(40))
    path.write_bytes(good + b"A line with bad bytes \xff here.\n")
    plan = splits.cut_splits([str(path)], target_bytes=100)
    assert len(plan) > 2
    offset = len(good)
    with pytest.raises(UserError, match=rf"{path}: line at byte {offset}: invalid UTF-8"):
        for split in plan:
            list(splits.read_split(split, CorpusStats(), strict=True))
    # The first split of a file knows its line numbers: the message iter_documents gives.
    whole = splits.cut_splits([str(path)])
    with pytest.raises(UserError, match=rf"{path}:121: invalid UTF-8"):
        list(splits.read_split(whole[0], CorpusStats(), strict=True))
    with pytest.raises(UserError, match=rf"{path}:121: invalid UTF-8"):
        read_documents([path], strict=True)

    records = tmp_path / "bad.jsonl"
    lines = [json.dumps({"text": f"Record {i}."}) for i in range(30)]
    records.write_text("\n".join([*lines, "{not json"]) + "\n", encoding="utf-8")
    offset = sum(len(line) + 1 for line in lines)
    plan = splits.cut_splits([str(records)], target_bytes=80)
    with pytest.raises(UserError, match=rf"{records}: line at byte {offset}: not valid JSON"):
        for split in plan:
            list(splits.read_split(split, CorpusStats(), strict=True))


def test_damaged_inputs_are_one_line_naming_the_file(tmp_path, corpora):
    damaged = tmp_path / "damaged.parquet"
    damaged.write_text("plain text, not Parquet\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"--input {damaged}: not a readable Parquet file"):
        splits.cut_splits([str(damaged)])
    dump = corpora["wikipedia"]
    cut = tmp_path / "enwiki-cut-multistream.xml.bz2"
    cut.write_bytes(dump.read_bytes()[:-200])
    plan = splits.cut_splits([str(cut)], target_bytes=2000)
    with pytest.raises(UserError, match=rf"--input {cut}: not a readable Wikipedia XML dump"):
        for split in plan:
            list(splits.read_split(split, CorpusStats(), check_text=True))
    with pytest.raises(UserError, match=r"input not found: .*missing\.txt"):
        splits.cut_splits([str(tmp_path / "missing.txt")])


@pytest.mark.gcs
def test_splits_read_from_a_bucket_each_byte_once(corpora, tmp_path):
    """The same splits, documents, keys and bytes read from gs:// (the Cloud Storage emulator:
    ``pytest -m gcs tests/test_data_splits.py``): each read is one ranged request for exactly
    the bytes asked."""
    from bert_jax.runtime import fs
    from tests import gcs_emulator

    with gcs_emulator.running(tmp_path / "gcs") as emulator:
        emulator.create_bucket("bert-jax-splits")
        local = [str(path) for path in corpora.values()]
        remote = [f"gs://bert-jax-splits/in/{os.path.basename(path)}" for path in local]
        for path, url in zip(local, remote):
            fs.upload(path, url)
        for target in (1 << 40, 2000):
            probes = splits.ByteCount()
            plan = splits.cut_splits(remote, target_bytes=target, byte_count=probes)
            local_plan = splits.cut_splits(local, target_bytes=target)
            assert [(s.kind, s.start, s.stop) for s in plan] == [
                (s.kind, s.start, s.stop) for s in local_plan
            ]
            keyed, stats, count = _read_all(plan)
            local_keyed, local_stats, local_count = _read_all(local_plan)
            assert keyed == local_keyed and _counts(stats) == _counts(local_stats)
            assert count == local_count and probes.extra > 0
            chunks, _ = _parquet_layout(corpora["parquet"])
            others = sum(os.path.getsize(p) for p in local if not p.endswith(".parquet"))
            assert count.content == others + chunks


def test_planning_refuses_a_split_size_under_a_byte_and_unknown_options(corpora):
    with pytest.raises(UserError, match="split size must be at least 1 byte, not 0"):
        splits.cut_splits([str(corpora["text"])], target_bytes=0)
    with pytest.raises(TypeError, match="num_workers"):
        splits.cut_splits([str(corpora["text"])], num_workers=2)
    plan = splits.cut_splits([str(corpora["text"])], text_field="body", strict=True)
    assert [(s.start, s.stop) for s in plan] == [(0, os.path.getsize(corpora["text"]))]


@pytest.mark.gcs
def test_a_bucket_inputs_identity_is_its_metadata_not_a_second_read(corpora, tmp_path):
    """prepare's manifest names a gs:// input by size, checksum and generation from storage's
    metadata: the launching machine reads none of it, so the workers' one read is the only read
    (which refuses a binary object); a rewritten object is another input."""
    from bert_jax.data.records import manifest
    from bert_jax.runtime import fs
    from tests import gcs_emulator

    reads: list[int] = []
    real_range_file = fs.RangeFile

    class CountingRangeFile(real_range_file):
        def readinto(self, buffer):
            count = super().readinto(buffer)
            reads.append(count or 0)
            return count

    big = tmp_path / "big.txt"
    big.write_text("".join(f"Sentence {i} of a long document.\n" for i in range(20_000)) + "\n")
    with gcs_emulator.running(tmp_path / "gcs") as emulator:
        emulator.create_bucket("bert-jax-identity")
        url = "gs://bert-jax-identity/in/big.txt"
        fs.upload(str(big), url)
        original_open = fs.open
        opened: list[str] = []

        def tracking_open(path, *args, **kwargs):
            opened.append(str(path))
            return original_open(path, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fs, "RangeFile", CountingRangeFile)
            patch.setattr(fs, "open", tracking_open)
            [entry] = manifest.input_identity([url])
        assert sum(reads) == 0 and opened == []  # metadata alone
        assert entry["size"] == big.stat().st_size and entry["path"] == url
        assert entry.get("crc32c") or entry.get("md5Hash")

        big.write_text(big.read_text().replace("Sentence 7 ", "Sentence 8 "))
        fs.upload(str(big), url)
        [rewritten] = manifest.input_identity([url])
        assert rewritten != entry

        binary = tmp_path / "image.txt"
        binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
        fs.upload(str(binary), "gs://bert-jax-identity/in/image.txt")
        # Refused where it is read (the first split of the file), naming the file and line.
        (split,) = splits.cut_splits(["gs://bert-jax-identity/in/image.txt"])
        with pytest.raises(UserError, match=r"image\.txt: binary data, not text"):
            list(splits.read_split(split, CorpusStats(), check_text=True))


def test_a_splits_kind_is_its_sources_one_corpus_format(corpora):
    """What a source is read as is decided once (``kinds.corpus_format``): the splits carry
    that decision as their kind, for every kind of file and named corpus."""
    from bert_jax.data.sources import kinds

    assert splits.KINDS is kinds.CORPUS_FORMATS
    sources = [*(str(path) for path in corpora.values()), "embedded:eval"]
    for split in splits.cut_splits(sources):
        assert split.kind == kinds.corpus_format(split.source)
    assert {s.kind for s in splits.cut_splits(sources)} >= {"text", "embedded"}
