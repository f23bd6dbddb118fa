"""Local pretraining text: downloaded C4 shards (mirrored json.gz layout) selected by one gin
binding, and a researcher's own .txt / .jsonl corpus with any objective."""

import gzip
import json

import gin
import pytest
import seqio

from t5x_like import (
    input_pipeline,
    tasks,  # noqa: F401  (registers the tasks)
)
from t5x_like.data import text_files
from t5x_like.errors import ConfigError
from t5x_like.families.t5.model import EncoderDecoderModel
from t5x_like.tasks import offline
from tests.tiny_tfds import with_offline_vocabulary

PROSE = [
    "The river carried the boats down to the sea every morning in spring.",
    "Merchants sold bread and fish along the quay while children played.",
    "In the evening the lanterns were lit and the town grew quiet again.",
]


def _write_c4_shards(directory):
    directory.mkdir(parents=True, exist_ok=True)
    for split, shards in (("train", 2), ("validation", 1)):
        for i in range(shards):
            path = directory / f"c4-{split}.{i:05d}-of-{shards:05d}.json.gz"
            with gzip.open(path, "wt", encoding="utf-8") as f:
                for j, text in enumerate(PROSE):
                    f.write(
                        json.dumps(
                            {
                                "text": f"{text} ({split} {i} {j})",
                                "timestamp": "2019-04-25T12:57:54Z",
                                "url": f"https://example.org/{split}/{i}/{j}",
                            }
                        )
                        + "\n"
                    )


def test_c4_tasks_read_downloaded_shards_when_bound(tmp_path):
    _write_c4_shards(tmp_path / "c4" / "en")
    gin.bind_parameter("c4_files.json_dir", str(tmp_path / "c4" / "en"))
    task = seqio.get_mixture_or_task("c4_v220_span_corruption")
    input_pipeline.check_data_available(task, "train")  # files found: no TFDS needed
    records = list(task.source.get_dataset("validation", shuffle=False).as_numpy_iterator())
    assert [r["text"].decode() for r in records] == [
        f"{t} (validation 0 {j})" for j, t in enumerate(PROSE)
    ]
    assert records[0]["url"] == b"https://example.org/validation/0/0"
    assert records[0]["timestamp"] == b"2019-04-25T12:57:54Z"
    assert len(task.source.list_shards("train")) == 2
    # The whole objective pipeline runs on them.
    variant = with_offline_vocabulary("c4_v220_prefix_lm", "c4_files_test_prefix_lm")
    examples = list(
        variant.get_dataset(
            {"inputs": 32, "targets": 32}, split="train", shuffle=False, seed=0
        ).as_numpy_iterator()
    )
    vocab = offline.OfflineVocabulary()
    text = " ".join(
        vocab.decode(e["inputs"].tolist()) + " " + vocab.decode(e["targets"].tolist())
        for e in examples
    )
    assert "river" in text and "lanterns" in text


def test_without_the_binding_c4_reads_tfds():
    from t5x_like.tasks import c4

    assert seqio.get_mixture_or_task("c4_v220_span_corruption").source.source is c4.C4_TFDS_SOURCE


def test_missing_shards_are_explained(tmp_path):
    gin.bind_parameter("c4_files.json_dir", str(tmp_path / "nowhere"))
    task = seqio.get_mixture_or_task("c4_v220_bert_style")
    with pytest.raises(ConfigError, match=r"reads files .*c4-train\.\*\.json\*.* none exist"):
        input_pipeline.check_data_available(task, "train")


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_text_corpus_with_any_objective(tmp_path, kind):
    if kind == "txt":
        (tmp_path / "train.txt").write_text("\n".join(PROSE) + "\n\n")
        (tmp_path / "val.txt").write_text(PROSE[0] + "\n")
        gin.bind_parameter("text_corpus.train_files", str(tmp_path / "train.txt"))
        gin.bind_parameter("text_corpus.validation_files", str(tmp_path / "val.txt"))
    else:
        with gzip.open(tmp_path / "train.jsonl.gz", "wt") as f:
            for text in PROSE:
                f.write(json.dumps({"body": text, "id": 1}) + "\n")
        gin.bind_parameter("text_corpus.train_files", str(tmp_path / "*.jsonl.gz"))
        gin.bind_parameter("text_corpus.text_key", "body")
    task = seqio.get_mixture_or_task("text_corpus_deshuffling")
    input_pipeline.check_data_available(task, "train")
    raw = [
        r["text"].decode()
        for r in task.source.get_dataset("train", shuffle=False).as_numpy_iterator()
    ]
    assert raw == PROSE  # blank lines skipped, one document per line / JSON record
    variant = with_offline_vocabulary("text_corpus_deshuffling", f"text_corpus_test_{kind}")
    example = next(
        variant.get_dataset(
            {"inputs": 64, "targets": 64}, split="train", shuffle=False, seed=0
        ).as_numpy_iterator()
    )
    # Deshuffling: the inputs are the targets' tokens in another order.
    assert sorted(example["inputs"].tolist()) == sorted(example["targets"].tolist())
    assert example["inputs"].tolist() != example["targets"].tolist()


def test_text_corpus_without_files_is_explained():
    task = seqio.get_mixture_or_task("text_corpus_span_corruption")
    with pytest.raises(ConfigError, match="bind text_corpus.train_files"):
        input_pipeline.check_data_available(task, "train")


def test_jsonl_without_the_text_field_is_explained(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    source = text_files.JsonlDataSource({"train": str(tmp_path / "a.jsonl")})
    with pytest.raises(Exception, match=r"a\.jsonl.*has no top-level string field text"):
        list(source.get_dataset("train", shuffle=False).as_numpy_iterator())


# --------------------------------------------------------------------------- JSON lines
def _random_records(n: int, seed: int):
    """JSON lines as json.dumps writes them (ASCII-escaped or not, keys in any order), with
    text that stresses a parser: quotes, backslashes, control characters, astral characters
    (surrogate pairs when escaped), a lone surrogate, and a fake '"text":' inside another
    field."""
    import random

    rng = random.Random(seed)
    alphabet = [
        "a",
        "Z",
        " ",
        '"',
        "\\",
        "/",
        "\n",
        "\t",
        "\r",
        "\b",
        "\f",
        "é",
        "ß",
        "ﬁ",
        "中",
        "😀",
        "\u2028",
        "\x01",
        "\x1f",
        "{",
        "}",
        ":",
        ",",
        "u",
        "\\u",
        "text",
        '"text": "x"',
    ]
    for _ in range(n):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.05:
            text += "\ud800"  # a lone surrogate: json.dumps escapes it, json.loads keeps it
        record = {
            "url": "".join(rng.choice(alphabet) for _ in range(6)),
            "text": text,
            "n": rng.randint(-9, 9),
            "ok": rng.random() < 0.5,
            "none": None,
        }
        items = list(record.items())
        rng.shuffle(items)
        yield json.dumps(dict(items), ensure_ascii=rng.random() < 0.5 or "\ud800" in text)


def test_json_lines_are_parsed_as_python_json_parses_them():
    """Reference: Python's json module. Every field read with TensorFlow ops equals
    json.loads(line)[key] (a lone surrogate, which is no UTF-8 text, reads as U+FFFD)."""
    import tensorflow as tf

    lines = list(_random_records(600, seed=3))
    ds = tf.data.Dataset.from_tensor_slices(lines).map(
        lambda line: [text_files.json_string_value(line, key) for key in ("text", "url")]
    )
    for line, ((found, text), (_, url)) in zip(lines, ds.as_numpy_iterator()):
        record = json.loads(line)
        assert found
        assert text.decode("utf-8") == record["text"].replace("\ud800", "\ufffd"), line
        assert url.decode("utf-8") == record["url"], line


@pytest.mark.parametrize(
    "line,key",
    [
        ('{"text": "a", "text": "b"}', "text"),  # a key twice: json.loads keeps the last
        ('{"text": "\\u0002x\\\\u0041"}', "text"),  # U+0002, then an escaped backslash + "u0041"
        ('{"t€": "v", "a\\"b": "w"}', "t€"),  # keys that are no plain word
        ('{"t€": "v", "a\\"b": "w"}', 'a"b'),
        ('{ "n" : -1.5e3 , "ok": true, "none": null, "text" : "x" }', "text"),
    ],
)
def test_json_corner_cases_equal_json_loads(line, key):
    """Reference: Python's json module, on lines the random test does not make."""
    found, value = text_files.json_string_value(tf_constant(line), key)
    assert bool(found) and value.numpy().decode("utf-8") == json.loads(line)[key]


def test_kept_fields_that_are_numbers_read_as_written():
    line = tf_constant('{"text": "x", "timestamp": 1577836800, "url": null}')
    assert text_files.json_scalar_text(line, "timestamp").numpy() == b"1577836800"
    assert text_files.json_scalar_text(line, "url").numpy() == b"null"
    assert text_files.json_scalar_text(line, "missing").numpy() == b""


def tf_constant(value):
    import tensorflow as tf

    return tf.constant(value)


@pytest.mark.parametrize("max_chars", [None, 50], ids=["whole_lines", "lines_split"])
def test_a_json_gz_corpus_resumes_from_its_saved_position(tmp_path, max_chars):
    """The exact-resume path for a JSON-lines source: the stream saved after 3 batches is
    restored (not re-read by skipping) and continues with the batches the uninterrupted
    stream reads next. Before the fix the save failed on tf.py_function. With a 50-character
    document limit every line (~200 characters) is split, and the position still saves."""
    import numpy as np

    from t5x_like import train_data

    gin.bind_parameter("text_files.max_document_chars", max_chars)

    with gzip.open(tmp_path / "train.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(60):
            f.write(json.dumps({"text": f"{PROSE[i % 3]} Line {i}. " * 3}) + "\n")
    gin.bind_parameter("text_corpus.train_files", str(tmp_path / "train.jsonl.gz"))
    with_offline_vocabulary("text_corpus_span_corruption", "text_corpus_resume_test")
    order = train_data.DataOrder("text_corpus_resume_test", batch_size=2, seed=1, data_shards=1)
    lengths = {"inputs": 32, "targets": 16}
    stream = train_data.HostBatches(
        order, lengths, model=EncoderDecoderModel(), process_index=0, process_count=1
    )
    for _ in range(3):
        next(stream)
    assert stream.save(str(tmp_path / "input_state" / "3")) is None
    expected = [next(stream) for _ in range(2)]
    resumed = train_data.HostBatches(
        order,
        lengths,
        model=EncoderDecoderModel(),
        start_batch=3,
        restore_from=str(tmp_path / "input_state" / "3"),
        process_index=0,
        process_count=1,
    )
    assert resumed.how_started.startswith("restored"), resumed.how_started
    for batch in expected:
        got = next(resumed)
        for key, value in batch.items():
            np.testing.assert_array_equal(value, got[key], err_msg=key)


def test_a_corpus_without_validation_files_has_no_validation_split(tmp_path):
    (tmp_path / "train.txt").write_text("\n".join(PROSE) + "\n")
    gin.bind_parameter("text_corpus.train_files", str(tmp_path / "train.txt"))
    task = seqio.get_mixture_or_task("text_corpus_span_corruption")
    assert list(task.splits) == ["train"]  # never the training files again
    with pytest.raises(
        ConfigError, match="no files for split 'validation'.*text_corpus.validation_files"
    ):
        input_pipeline.check_data_available(task, "validation")


# ------------------------------------------------------------------- over-long documents
LONG = "Mañana 😀 " * 7 + "end"  # 66 characters, multi-byte ones among them


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_a_line_over_the_document_limit_is_split_into_documents_of_the_limit(tmp_path, kind):
    """Reference: Python's slicing by code points, LONG[i:i + 20]. A line over
    `text_files.max_document_chars` becomes consecutive documents of at most that many
    characters (never cut inside a UTF-8 character), other fields repeated; a line within
    the limit passes whole."""
    gin.bind_parameter("text_files.max_document_chars", 20)
    if kind == "txt":
        (tmp_path / "c.txt").write_text(f"short one\n{LONG}\nlast\n", encoding="utf-8")
        source = text_files.TextFileDataSource({"train": str(tmp_path / "c.txt")})
    else:
        (tmp_path / "c.jsonl").write_text(
            "".join(
                json.dumps({"text": t, "url": f"u{i}"}) + "\n"
                for i, t in enumerate(["short one", LONG, "last"])
            )
        )
        source = text_files.JsonlDataSource({"train": str(tmp_path / "c.jsonl")})
    records = list(source.get_dataset("train", shuffle=False).as_numpy_iterator())
    pieces = [LONG[i : i + 20] for i in range(0, len(LONG), 20)]
    assert len(pieces) == 4
    assert [r["text"].decode("utf-8") for r in records] == ["short one", *pieces, "last"]
    if kind == "jsonl":
        assert [r["url"] for r in records] == [b"u0"] + [b"u1"] * 4 + [b"u2"]


def test_document_limit_off_and_a_negative_limit_refused(tmp_path):
    (tmp_path / "c.txt").write_text(LONG + "\n", encoding="utf-8")
    gin.bind_parameter("text_files.max_document_chars", 0)  # 0 (or None): no limit
    source = text_files.TextFileDataSource({"train": str(tmp_path / "c.txt")})
    assert [
        r["text"].decode() for r in source.get_dataset("train", shuffle=False).as_numpy_iterator()
    ] == [LONG]
    gin.bind_parameter("text_files.max_document_chars", -5)
    with pytest.raises(ConfigError, match="text_files.max_document_chars=-5"):
        text_files.TextFileDataSource({"train": str(tmp_path / "c.txt")})


_TOKENIZE_ONE_LONG_LINE = """
import resource, sys
import gin, tensorflow as tf
from t5x_like.data import text_files
from t5x_like.tasks import offline
gin.bind_parameter("text_files.max_document_chars", int(sys.argv[2]))
vocabulary = offline.OfflineVocabulary()
source = text_files.TextFileDataSource({"train": sys.argv[1]})
dataset = source.get_dataset("train", shuffle=False).map(
    lambda d: vocabulary.encode_tf(d["text"]))
next(dataset.as_numpy_iterator())  # warm: the vocabulary and TF's own buffers
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tokens = sum(len(t) for t in dataset.as_numpy_iterator())
print(tokens, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_tokenizing_a_huge_line_stays_within_bounded_memory(tmp_path, offline_cache):
    """SentencePiece holds ~100 bytes per character of the string it tokenizes: a 2 MB line
    tokenized whole raises the peak RSS by ~200 MB (a 50 MB one by ~5 GB). Split at 20,000
    characters, its documents take a few MB each. Measured in a fresh process (ru_maxrss is
    a process-wide peak)."""
    import os
    import subprocess
    import sys

    (tmp_path / "c.txt").write_text("tiny\n" + "river boats " * 170_000 + "\n")  # 2 MB
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [sys.executable, "-c", _TOKENIZE_ONE_LONG_LINE, str(tmp_path / "c.txt"), "20000"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    tokens, growth_kib = map(int, out.stdout.split()[-2:])
    assert tokens > 170_000  # the whole line was tokenized, in pieces
    assert growth_kib < 60_000, f"peak RSS grew {growth_kib} KiB"
