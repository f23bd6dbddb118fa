"""The T5 paper's text-to-text formats as seqio preprocessors (one example in, `inputs` and
`targets` strings out), in the t5 library's canonical forms so released checkpoints transfer:

  glue / super_glue  "<benchmark> <field1>: <text1> <field2>: <text2> ..." with the fields in
                     alphabetical order of their TFDS names -> the label's name
                     ("mnli hypothesis: ... premise: ..." -> "entailment")
  stsb               ... -> the score rounded to the nearest 0.2, written "2.6"
  wsc / dpr          "wsc: <text with the pronoun marked>" -> the referent noun phrase
  record             "record query: ... entities: a, b passage: ..." -> one answer
  squad              "question: ... context: ..." (punctuation padded, as t5 did) -> answer
  summarize          "summarize: <article>" -> highlights
  translate          "translate English to German: <en>" -> de

Labels of unlabelled test examples (-1) become "<unk>".
"""

from __future__ import annotations

from typing import Sequence

import seqio
import tensorflow as tf

UNKNOWN_LABEL = "<unk>"


def _join(parts: Sequence[tf.Tensor | str]) -> tf.Tensor:
    return tf.strings.join(list(parts), separator=" ")


def _label_name(label: tf.Tensor, label_names: Sequence[str]) -> tf.Tensor:
    names = tf.constant(list(label_names))
    label = tf.cast(label, tf.int32)
    return tf.where(label < 0, UNKNOWN_LABEL, tf.gather(names, tf.maximum(label, 0)))


def remove_markup(text: tf.Tensor) -> tf.Tensor:
    """MultiRC paragraphs carry HTML line breaks and bold tags; the text keeps neither."""
    text = tf.strings.regex_replace(text, r"<br>", " ")
    return tf.strings.regex_replace(text, r"<(/)?b>", "")


@seqio.map_over_dataset
def glue(x, benchmark_name: str, label_names: Sequence[str] | None,
         feature_names: Sequence[str] | None = None, id_key: str = "idx"):
    """GLUE/SuperGLUE classification and regression as text. `label_names` None means a
    regression label (STS-B), rounded to 0.2 and written with one decimal."""
    keys = feature_names or sorted(k for k in x if k not in ("label", id_key))
    parts: list = [benchmark_name]
    for key in keys:
        text = remove_markup(x[key]) if benchmark_name == "multirc" else x[key]
        parts += [f"{key}:", text]
    if label_names is None:
        rounded = tf.round(tf.cast(x["label"], tf.float32) * 5.0) / 5.0
        target = tf.strings.as_string(rounded, precision=1)
    else:
        target = _label_name(x["label"], label_names)
    out = {"inputs": _join(parts), "targets": target}
    if "label" in x:
        out["label"] = x["label"]
    if id_key in x:
        idx = x[id_key]
        if isinstance(idx, dict):  # MultiRC: answers are grouped by paragraph and question
            out["idx_paragraph"], out["idx_question"] = idx["paragraph"], idx["question"]
        else:
            out["idx"] = idx
    return out


def mark_span(text: tf.Tensor, span: tf.Tensor, word_index: tf.Tensor,
              mark: str = "*") -> tf.Tensor:
    """'... in front of them was it ...' -> '... was * it * ...': the span's words, starting
    at whitespace-word `word_index`, between marks (t5's WSC highlighting)."""
    words = tf.strings.split(text, sep=" ")
    n = tf.size(tf.strings.split(span, sep=" "))
    i = tf.cast(word_index, tf.int32)
    marked = tf.concat([words[:i], [mark], words[i:i + n], [mark], words[i + n:]], axis=0)
    return tf.strings.reduce_join(marked, separator=" ")


@seqio.map_over_dataset
def wsc_simple(x):
    """SuperGLUE WSC in the referent format: mark the pronoun, predict the noun phrase."""
    text = mark_span(x["text"], x["span2_text"], x["span2_index"])
    return {"inputs": _join(["wsc:", text]), "targets": x["span1_text"], "label": x["label"],
            "idx": x["idx"]}


def keep_true_examples(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """WSC trains only on examples whose candidate is the correct referent."""
    return dataset.filter(lambda x: tf.equal(x["label"], 1))


@seqio.map_over_dataset
def definite_pronoun_resolution_simple(x):
    """DPR (the Winograd-like dataset of Rahman & Ng) in WSC's format; the first occurrence of
    the pronoun is the one to resolve."""
    pattern = tf.strings.join([" (", x["pronoun"], ") "])
    sentence = tf.strings.regex_replace(x["sentence"], pattern, r" *\1* ", replace_global=False)
    label = tf.cast(x["label"], tf.int32)
    return {"inputs": _join(["wsc:", sentence]),
            "targets": x["candidates"][tf.maximum(label, 0)]}


def record(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """ReCoRD: one example per gold answer (all answers kept for the max-over-answers metric);
    highlights in the passage become sentences."""

    def expand(x):
        passage = tf.strings.regex_replace(x["passage"], r"(\.|\?|\!|\"|\')\n@highlight\n",
                                           r"\1 ")
        passage = tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")
        inputs = _join(["record query:", x["query"], "entities:",
                        tf.strings.reduce_join(x["entities"], separator=", "), "passage:",
                        passage])
        answers = x["answers"]
        targets = tf.cond(tf.size(answers) > 0, lambda: answers,
                          lambda: tf.constant([UNKNOWN_LABEL]))
        n = tf.size(targets)
        return tf.data.Dataset.from_tensor_slices({
            "inputs": tf.repeat(inputs, n), "targets": targets,
            "answers": tf.repeat(tf.expand_dims(answers, 0), n, axis=0),
            "idx_passage": tf.repeat(x["idx"]["passage"], n),
            "idx_query": tf.repeat(x["idx"]["query"], n)})

    return dataset.flat_map(expand)


def pad_punctuation(text: tf.Tensor) -> tf.Tensor:
    """Spaces around every character that is not a letter, digit, mark or underscore (t5's
    SQuAD text), then single spaces."""
    text = tf.strings.regex_replace(text, r"([^_\s\p{N}\p{L}\p{M}])", r" \1 ")
    return tf.strings.strip(tf.strings.regex_replace(text, r"\s+", " "))


@seqio.map_over_dataset
def squad(x):
    """SQuAD v1.1: 'question: ... context: ...' -> the first answer; all answers are kept."""
    answers = pad_punctuation(x["answers"]["text"])
    question, context = pad_punctuation(x["question"]), pad_punctuation(x["context"])
    return {"inputs": _join(["question:", question, "context:", context]),
            "targets": answers[0], "answers": answers, "id": x["id"]}


@seqio.map_over_dataset
def summarize(x, article_key: str = "article", summary_key: str = "highlights"):
    return {"inputs": _join(["summarize:", x[article_key]]), "targets": x[summary_key]}


LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}


@seqio.map_over_dataset
def translate(x, source_language: str, target_language: str):
    prefix = (f"translate {LANGUAGE_NAMES[source_language]} to "
              f"{LANGUAGE_NAMES[target_language]}:")
    return {"inputs": _join([prefix, x[source_language]]), "targets": x[target_language]}
