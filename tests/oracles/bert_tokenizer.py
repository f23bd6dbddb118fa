"""Oracle: Google BERT's `tokenization.FullTokenizer` (bert-tensorflow 1.0.4) and the
reference's masked-LM random-token draw (`create_pretraining_data.py`).

Payload:
  {"runs": [{"vocab": path, "lower_case": bool, "texts": [str], "texts_hex": [hex bytes]}],
   "random_tokens": {"vocab": path, "draws": n, "seed": s}}   (both keys optional)

Returns {"runs": [{"ids": [[int]], "ids_hex": [[int]], "vocab_size": n}],
         "random_tokens": {"counts": {id: n}}}: the ids FullTokenizer gives each text (each
text given as bytes too, which FullTokenizer decodes with errors ignored), and how often each id
is drawn by the reference's `vocab_words[rng.randint(0, len(vocab_words) - 1)]`, converted
to ids as `write_instance_to_example_files` converts the masked tokens.
"""

import collections
import random

from tests.oracle import oracle_main


def _tokenizer(vocab, lower_case):
    from bert import tokenization

    tokenization.FLAGS.mark_as_parsed()  # the tokenizer reads --preserve_unused_tokens
    return tokenization.FullTokenizer(vocab, do_lower_case=lower_case)


def _ids(tokenizer, text):
    return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))


def _run(run):
    tokenizer = _tokenizer(run["vocab"], run["lower_case"])
    return {
        "ids": [_ids(tokenizer, t) for t in run.get("texts", [])],
        "ids_hex": [_ids(tokenizer, bytes.fromhex(t)) for t in run.get("texts_hex", [])],
        "vocab_size": len(tokenizer.vocab),
    }


def _random_tokens(case):
    """The reference's 10 % replacement, many times: `create_masked_lm_predictions` draws
    `vocab_words[rng.randint(0, len(vocab_words) - 1)]` with `vocab_words =
    list(tokenizer.vocab.keys())`."""
    tokenizer = _tokenizer(case["vocab"], True)
    vocab_words = list(tokenizer.vocab.keys())
    rng = random.Random(case["seed"])
    words = [vocab_words[rng.randint(0, len(vocab_words) - 1)] for _ in range(case["draws"])]
    counts = collections.Counter(tokenizer.convert_tokens_to_ids(words))
    return {"counts": {str(k): v for k, v in sorted(counts.items())}}


def compute(payload):
    result = {"runs": [_run(run) for run in payload.get("runs", [])]}
    if "random_tokens" in payload:
        result["random_tokens"] = _random_tokens(payload["random_tokens"])
    return result


if __name__ == "__main__":
    oracle_main(compute)
