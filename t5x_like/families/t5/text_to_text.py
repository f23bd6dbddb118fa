"""The T5 paper's text-to-text formats as seqio preprocessors (one example in, `inputs` and
`targets` strings out), string for string the T5 library's (t5.data.preprocessors, as
t5.data.tasks wires them), so released checkpoints transfer:

  glue / super_glue  "<benchmark> <field1>: <text1> <field2>: <text2> ..." with the fields in
                     alphabetical order of their TFDS names (MultiRC: question, answer,
                     paragraph; WiC: sentence1, sentence2, word) -> the label's name
                     ("mnli hypothesis: ... premise: ..." -> "entailment")
  stsb               ... -> the score rounded to the nearest 0.2, written "2.6"
  wsc / dpr          "wsc: Mark told Pete ... *He* should ..." -> the referent noun phrase
  record             "record query: ... entities: a, b passage: ..." -> one answer
  squad              "question: ... context: ..." (ASCII punctuation padded) -> answer
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
def glue(
    x,
    benchmark_name: str,
    label_names: Sequence[str] | None,
    feature_names: Sequence[str] | None = None,
    id_key: str = "idx",
):
    """GLUE/SuperGLUE classification and regression as text (t5.data.preprocessors.glue and
    .stsb). `label_names` None means a regression label (STS-B), rounded to 0.2 and written
    with one decimal. MultiRC's markup is removed from the joined text, as the reference
    does."""
    keys = feature_names or sorted(k for k in x if k not in ("label", id_key))
    parts: list = [benchmark_name]
    for key in keys:
        parts += [f"{key}:", x[key]]
    inputs = _join(parts)
    if benchmark_name == "multirc":
        inputs = remove_markup(inputs)
    if label_names is None:
        rounded = tf.round(tf.cast(x["label"], tf.float32) * 5.0) / 5.0
        target = tf.strings.as_string(rounded, precision=1)
    else:
        target = _label_name(x["label"], label_names)
    out = {"inputs": inputs, "targets": target}
    if "label" in x:
        out["label"] = x["label"]
    if id_key in x:
        idx = x[id_key]
        if isinstance(idx, dict):  # MultiRC: answers are grouped by paragraph and question
            out["idx_paragraph"], out["idx_question"] = idx["paragraph"], idx["question"]
        else:
            out["idx"] = idx
    return out


# SuperGLUE WSC texts whose span2_index does not point at the pronoun, with the text the T5
# library substitutes (t5.data.preprocessors._wsc_inputs, copied verbatim).
WSC_SPECIAL_CASES = (
    (
        "The boy continued to whip the pony , and eventually the pony threw him over. John "
        'laughed out quite loud. "Good for him," he said. ',
        "The boy continued to whip the pony , and eventually the pony threw him over. John "
        'laughed out quite loud. "Good for X ," he said.',
    ),
    (
        "When they had eventually calmed down a bit , and had gotten home, Mr. Farley put the "
        "magic pebble in an iron safe . Some day they might want to use it , but really for now, "
        "what more could they wish for?",
        "When they had eventually calmed down a bit , and had gotten home, Mr. Farley put the "
        "magic pebble in an iron safe . Some day they might want to use X , but really for now, "
        "what more could they wish for?",
    ),
)


def wsc_blank(text: tf.Tensor, word_index: tf.Tensor) -> tf.Tensor:
    """'Mitchell asked Tom if he could ...' -> 'Mitchell asked Tom if X could ...': the word
    at `word_index` of the text split on single spaces becomes X (the T5 library's
    `_wsc_inputs`). The reference asserts that the index is inside the text, not 0, and
    points at `span2_text` (its two special cases are the SuperGLUE texts that would fail
    the last); here such an example is blanked all the same instead of stopping the
    pipeline."""
    words = tf.strings.split([text], sep=" ").values
    i = tf.cast(word_index, tf.int32)
    blanked = tf.strings.join(
        [
            tf.strings.reduce_join(words[:i], separator=" "),
            "X",
            tf.strings.reduce_join(words[i + 1 :], separator=" "),
        ],
        separator=" ",
    )
    for original, replacement in WSC_SPECIAL_CASES:
        blanked = tf.where(tf.equal(text, original), replacement, blanked)
    return blanked


@seqio.map_over_dataset
def wsc_simple(x):
    """SuperGLUE WSC in the referent format (t5.data.preprocessors.wsc_simple): the pronoun
    between asterisks ('*he*'), the candidate noun phrase as the target."""
    marked = tf.strings.regex_replace(
        wsc_blank(x["text"], x["span2_index"]),
        r" X ",
        tf.strings.join([" *", x["span2_text"], "* "]),
    )
    return {
        "inputs": _join(["wsc:", marked]),
        "targets": tf.reshape(x["span1_text"], []),
        "label": x.get("label", 0),
        "idx": x["idx"],
    }


def keep_true_examples(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """WSC trains only on examples whose candidate is the correct referent (the reference's
    `correct_referent_only`: a label cast to bool, so an unlabelled -1 counts as true)."""
    return dataset.filter(lambda x: tf.cast(x["label"], tf.bool))


@seqio.map_over_dataset
def definite_pronoun_resolution_simple(x):
    """DPR (the Winograd-like dataset of Rahman & Ng) in WSC's format: the first occurrence
    of the pronoun after a space and before a space, '.' or ',' is the one to resolve (the
    reference's pattern, the pronoun inserted into it as a regular expression)."""
    pattern = tf.strings.join([r" (", x["pronoun"], r")( |\.|,)"])
    sentence = tf.strings.regex_replace(x["sentence"], pattern, r" *\1*\2", replace_global=False)
    return {"inputs": _join(["wsc:", sentence]), "targets": x["candidates"][x["label"]]}


def record(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """ReCoRD: one example per gold answer (all answers kept for the max-over-answers metric);
    highlights in the passage become sentences."""

    def expand(x):
        passage = tf.strings.regex_replace(x["passage"], r"(\.|\?|\!|\"|\')\n@highlight\n", r"\1 ")
        passage = tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")
        inputs = _join(
            [
                "record query:",
                x["query"],
                "entities:",
                tf.strings.reduce_join(x["entities"], separator=", "),
                "passage:",
                passage,
            ]
        )
        answers = x["answers"]
        targets = tf.cond(
            tf.size(answers) > 0, lambda: answers, lambda: tf.constant([UNKNOWN_LABEL])
        )
        n = tf.size(targets)
        return tf.data.Dataset.from_tensor_slices(
            {
                "inputs": tf.repeat(inputs, n),
                "targets": targets,
                "answers": tf.repeat(tf.expand_dims(answers, 0), n, axis=0),
                "idx_passage": tf.repeat(x["idx"]["passage"], n),
                "idx_query": tf.repeat(x["idx"]["query"], n),
            }
        )

    return dataset.flat_map(expand)


def pad_punctuation(text: tf.Tensor) -> tf.Tensor:
    """Spaces around every ASCII punctuation character (RE2's [[:punct:]], '_' included),
    then runs of whitespace as one space, not stripped (t5's `_pad_punctuation`: an answer
    ending in '.' keeps a trailing space)."""
    text = tf.strings.regex_replace(text, r"([[:punct:]])", r" \1 ")
    return tf.strings.regex_replace(text, r"\s+", " ")


def _string_join(parts: Sequence[tf.Tensor | str]) -> tf.Tensor:
    """Joined on spaces, runs of whitespace collapsed (t5's `_string_join`)."""
    return tf.strings.regex_replace(_join(parts), r"\s+", " ")


@seqio.map_over_dataset
def squad(x):
    """SQuAD v1.1: 'question: ... context: ...' -> the first answer; all answers are kept
    (t5.data.preprocessors.squad)."""
    answers = pad_punctuation(x["answers"]["text"])
    question, context = pad_punctuation(x["question"]), pad_punctuation(x["context"])
    return {
        "inputs": _string_join(["question:", question, "context:", context]),
        "targets": answers[0],
        "answers": answers,
        "id": x["id"],
    }


@seqio.map_over_dataset
def summarize(x, article_key: str = "article", summary_key: str = "highlights"):
    return {"inputs": _join(["summarize:", x[article_key]]), "targets": x[summary_key]}


LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}


@seqio.map_over_dataset
def translate(x, source_language: str, target_language: str):
    prefix = f"translate {LANGUAGE_NAMES[source_language]} to {LANGUAGE_NAMES[target_language]}:"
    return {"inputs": _join([prefix, x[source_language]]), "targets": x[target_language]}
