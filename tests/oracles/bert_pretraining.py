"""Oracle: Google BERT's create_pretraining_data.py (bert-tensorflow 1.0.4) on a corpus.

Payload: {"dir": a folder to write in, "vocab": vocab.txt's lines, "corpus": the corpus file's
text (one sentence per line, blank lines between documents), "max_seq_length",
"max_predictions_per_seq", "dupe_factor", "short_seq_prob", "masked_lm_prob", "random_seed",
"write_records": bool}. Runs `create_training_instances` with a `FullTokenizer` (lower-cased)
on the vocabulary, and with "write_records" `write_instance_to_example_files` into
dir/reference.tfrecord. Returns the documents as the reference read them (ids, in file order)
and every instance as ids: the masked `inputs`, `segment_ids`, `masked_lm_positions`,
`targets` (the original ids there) and `next_sentence_labels`, in the reference's order.
"""

import os
import random

from tests.oracle import oracle_main


class _Recording(random.Random):
    """random.Random that keeps a copy of the first list it shuffles: in
    create_training_instances that is `all_documents` as read, before it is shuffled."""

    documents = None

    def shuffle(self, x):
        if self.documents is None:
            self.documents = [list(d) for d in x]
        super().shuffle(x)


def compute(payload):
    from bert import create_pretraining_data as cpd
    from bert import tokenization

    cpd.FLAGS.mark_as_parsed()
    folder = payload["dir"]
    vocab_file = os.path.join(folder, "reference_vocab.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("\n".join(payload["vocab"]) + "\n")
    corpus_file = os.path.join(folder, "reference_corpus.txt")
    with open(corpus_file, "w", encoding="utf-8") as f:
        f.write(payload["corpus"])
    tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=True)
    rng = _Recording(payload["random_seed"])
    length, predictions = payload["max_seq_length"], payload["max_predictions_per_seq"]
    instances = cpd.create_training_instances(
        [corpus_file],
        tokenizer,
        length,
        payload["dupe_factor"],
        payload["short_seq_prob"],
        payload["masked_lm_prob"],
        predictions,
        rng,
    )
    if payload.get("write_records"):
        cpd.write_instance_to_example_files(
            instances, tokenizer, length, predictions, [os.path.join(folder, "reference.tfrecord")]
        )
    ids = tokenizer.convert_tokens_to_ids
    return {
        "documents": [[ids(s) for s in d] for d in (rng.documents or [])],
        "instances": [
            {
                "inputs": ids(x.tokens),
                "segment_ids": list(x.segment_ids),
                "masked_lm_positions": list(x.masked_lm_positions),
                "targets": ids(x.masked_lm_labels),
                "next_sentence_labels": int(x.is_random_next),
            }
            for x in instances
        ],
    }


if __name__ == "__main__":
    oracle_main(compute)
