"""Reading sources: what kind a source is, original-format text, JSONL, TFDS, bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from bert_jax.data.sources.documents import read_documents
from bert_jax.data.sources.kinds import source_kind
from bert_jax.runtime.errors import UserError


def test_importing_data_modules_does_not_import_tensorflow_or_jax():
    modules = [
        "tokenizers.load_or_train",
        "sources.kinds",
        "sources.readers",
        "sources.documents",
        "masking.settings",
        "masking.static_sequence",
        "masking.static_rows",
        "masking.dynamic_batch",
        "instances.sentence_pairs",
        "preparation.groups",
        "preparation.settings",
        "preparation.stage",
        "preparation.local_runner",
        "preparation.cached",
        "records.tfrecord",
        "pipeline.tf_data",
    ]
    code = (
        "import sys; import " + ", ".join(f"bert_jax.data.{m}" for m in modules) + "; "
        "print(sorted(m for m in ('tensorflow', 'jax') if m in sys.modules))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "[]"


def test_source_kind_tells_records_from_corpora(tmp_path):
    assert source_kind("tfds:wikipedia/20230601.en:train") == "tfds"
    assert source_kind("embedded") == source_kind("embedded:eval") == "embedded"
    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / "part-00000.tfrecord").write_bytes(b"")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("One.\n", encoding="utf-8")
    assert source_kind(tmp_path / "prepared") == "records"
    assert source_kind(str(tmp_path / "prepared" / "*.tfrecord")) == "records"
    assert source_kind("gs://bucket/tf_examples.tfrecord-00001-of-00010") == "records"
    assert source_kind(tmp_path / "text") == "text"
    assert source_kind(str(tmp_path / "text" / "*.txt")) == "text"
    assert source_kind("corpus.jsonl.gz") == "text"
    assert source_kind("embedded_notes.txt") == "text"


def test_original_format_text_files_with_bad_input(tmp_path):
    good = tmp_path / "a.txt"
    good.write_bytes(
        b"First sentence of doc one.\nSecond sentence of doc one.\n\n"
        b"Only sentence of doc two.\n\n\n\n"  # two extra blank lines: an empty document
        b"Doc three has bad bytes \xff\xfe here.\n"
        + b"x" * 5000
        + b"\n"  # absurdly long line (limit below is 1000 bytes)
        + b"Doc three continues.\n"
    )
    empty = tmp_path / "b.txt"
    empty.write_bytes(b"")
    zipped = tmp_path / "c.txt.gz"
    with gzip.open(zipped, "wb") as f:
        f.write(b"Gzip doc sentence one.\nGzip doc sentence two.\n")
    documents, stats = read_documents([good, empty, zipped], max_line_bytes=1000)
    assert documents == [
        ["First sentence of doc one.", "Second sentence of doc one."],
        ["Only sentence of doc two."],
        ["Doc three has bad bytes  here.", "Doc three continues."],
        ["Gzip doc sentence one.", "Gzip doc sentence two."],
    ]
    assert (stats.files, stats.empty_files, stats.documents, stats.sentences) == (3, 1, 4, 7)
    assert stats.empty_documents == 2
    assert stats.one_sentence_documents == 1
    assert stats.invalid_utf8_lines == 1
    assert stats.long_lines == 1
    assert f"{good}:9: long lines" in stats.problems
    assert f"{good}:8: invalid utf8 lines" in stats.problems
    assert f"{empty}: empty files" in stats.problems

    with pytest.raises(UserError, match=rf"{good.name}:8: invalid UTF-8"):
        read_documents([good], strict=True)
    long_only = tmp_path / "long.txt"
    long_only.write_bytes(b"Fine.\n" + b"z" * 2000 + b"\n")
    with pytest.raises(UserError, match=rf"{long_only.name}:2: line longer than 1000 bytes"):
        read_documents([long_only], strict=True, max_line_bytes=1000)


def test_long_lines_are_never_read_whole(tmp_path):
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        f.write(b"A normal first sentence.\n")
        f.write(b"y" * 3_000_000 + b"\n")
        f.write(b"A normal last sentence.\n")
    documents, stats = read_documents([path], max_line_bytes=10_000)
    assert documents == [["A normal first sentence.", "A normal last sentence."]]
    assert stats.long_lines == 1


def test_paragraph_per_line_files_can_be_sentence_split(tmp_path):
    path = tmp_path / "paragraphs.txt"
    path.write_text("One sentence. Two sentences.\n\nThree. Four!\n", encoding="utf-8")
    documents, _ = read_documents([path], sentence_split=True)
    assert documents == [["One sentence.", "Two sentences."], ["Three.", "Four!"]]


def test_jsonl_documents_and_bad_records(tmp_path):
    path = tmp_path / "docs.jsonl"
    lines = [
        json.dumps({"text": "First doc. It has two sentences.", "id": 1}),
        "{not json",
        json.dumps({"body": "no text field"}),
        json.dumps({"text": 7}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"text": "   "}),
        "",
        json.dumps({"text": "Second doc.\nNew paragraph here."}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    documents, stats = read_documents([path])
    assert documents == [
        ["First doc.", "It has two sentences."],
        ["Second doc.", "New paragraph here."],
    ]
    assert stats.bad_records == 4 and stats.empty_documents == 1
    assert f"{path}:2: bad records" in stats.problems
    with pytest.raises(UserError, match=rf"{path.name}:2: not valid JSON"):
        read_documents([path], strict=True)
    custom = tmp_path / "custom.jsonl"
    custom.write_text(json.dumps({"body": "Custom field. Works."}) + "\n", encoding="utf-8")
    assert read_documents([custom], text_field="body")[0] == [["Custom field.", "Works."]]


def test_missing_inputs_are_errors_naming_them(tmp_path):
    with pytest.raises(UserError, match="input not found: .*missing.txt"):
        read_documents([tmp_path / "missing.txt"])
    with pytest.raises(UserError, match=r"nothing-\*\.txt matches no files"):
        read_documents([str(tmp_path / "nothing-*.txt")])
    with pytest.raises(ValueError, match="split must be train, eval or all"):
        read_documents(["embedded:test"])
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("One.\nTwo.\n", encoding="utf-8")
    (tmp_path / "d" / ".hidden").write_text("Hidden.\n", encoding="utf-8")
    assert read_documents([tmp_path / "d"])[0] == [["One.", "Two."]]
    assert read_documents([str(tmp_path / "d" / "*.txt")])[0] == [["One.", "Two."]]


@pytest.fixture(scope="module")
def tfds_data_dir(tmp_path_factory):
    """A real TFDS dataset (a GeneratorBasedBuilder), prepared offline into a temporary dir."""
    import tensorflow_datasets as tfds

    class TinyWiki(tfds.core.GeneratorBasedBuilder):
        """Wikipedia-shaped examples: a title and a text of paragraphs."""

        VERSION = tfds.core.Version("1.0.0")
        BUILDER_CONFIGS = [
            tfds.core.BuilderConfig(name="en", description="English"),
            tfds.core.BuilderConfig(name="short", description="One paragraph each"),
        ]

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {"title": tfds.features.Text(), "text": tfds.features.Text()}
                ),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(6), "validation": self._generate_examples(3)}

        def _generate_examples(self, count):
            for i in range(count):
                text = f"Article {i} starts here. It has a second sentence."
                if self.builder_config.name == "en":
                    text += f"\n\nA new paragraph in article {i}! Does it end? Yes."
                if i == 1:
                    text = ""  # an empty page, as real dumps have
                yield i, {"title": f"Title {i}", "text": text}

    data_dir = tmp_path_factory.mktemp("tfds")
    for config in ("en", "short"):
        TinyWiki(config=config, data_dir=str(data_dir)).download_and_prepare()
    return str(data_dir)


def test_tfds_source_reads_a_locally_prepared_dataset(tfds_data_dir):
    documents, stats = read_documents(["tfds:tiny_wiki/en:validation"], tfds_data_dir=tfds_data_dir)
    assert sorted(documents) == [
        [
            f"Article {i} starts here.",
            "It has a second sentence.",
            f"A new paragraph in article {i}!",
            "Does it end?",
            "Yes.",
        ]
        for i in (0, 2)
    ]
    assert stats.empty_documents == 1 and stats.files == 1
    short, _ = read_documents(["tfds:tiny_wiki/short"], tfds_data_dir=tfds_data_dir)
    assert len(short) == 5 and all(len(d) == 2 for d in short)  # default split: train
    with pytest.raises(UserError, match="'no_such_dataset' not found"):
        read_documents(["tfds:no_such_dataset:train"], tfds_data_dir=tfds_data_dir)
    with pytest.raises(UserError, match="'mnist' is not prepared.*nothing is downloaded"):
        read_documents(["tfds:mnist:train"], tfds_data_dir=tfds_data_dir)
