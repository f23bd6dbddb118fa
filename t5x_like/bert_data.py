"""BERT's pretraining examples (Devlin et al., 2018, section 3.1 and appendix A.1), following
the reference `create_pretraining_data.py`:

* `sentence_pair_instances`: from a group of documents (each a list of tokenized sentences),
  `[CLS] A [SEP] B [SEP]` pairs. A is one or more whole sentences; B is the actual next text
  (IsNext, label 0) or, with probability 1/2, text from a random *other* document (NotNext,
  label 1), the unused sentences of A's document going back into the pool. (One deliberate
  difference from the reference: chunks of a single sentence are skipped instead of always
  becoming NotNext, which keeps the labels at the paper's 50/50.) With probability
  0.1 a shorter target length is drawn, so the model also sees short sequences. Pairs that are
  too long are truncated one token at a time from the longer side, at its front or back at
  random.
* `mask_tokens`: 15% of the positions that are not [CLS]/[SEP]/padding are predicted (at most
  `max_predictions`, e.g. 20 at length 128 and 80 at 512); of those 80% become [MASK], 10% a
  random token, 10% stay. With `whole_word` all pieces of a word (a piece and its '##'
  continuations) are chosen together.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

MASK_PROB = 0.15
NOT_NEXT, IS_NEXT = 1, 0


@dataclasses.dataclass
class PairInstance:
    tokens: list[int]
    segment_ids: list[int]
    is_random_next: bool
    source_document: int
    random_document: int | None = None


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator):
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def sentence_pair_instances(documents: Sequence[Sequence[Sequence[int]]], max_seq_length: int,
                            cls_id: int, sep_id: int, rng: np.random.Generator,
                            short_seq_prob: float = 0.1) -> list[PairInstance]:
    """Every document's sentence-pair instances (the reference's algorithm, per group)."""
    max_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
    out: list[PairInstance] = []
    for d, document in enumerate(documents):
        target = max_tokens
        if rng.random() < short_seq_prob:
            target = int(rng.integers(2, max_tokens + 1))
        chunk: list[Sequence[int]] = []
        length = 0
        i = 0
        while i < len(document):
            chunk.append(document[i])
            length += len(document[i])
            if i == len(document) - 1 or length >= target:
                # A one-sentence chunk has no next sentence inside it; the reference then
                # always draws a random B, which skews the labels (~57% NotNext on real
                # documents). Such chunks are skipped, so IsNext/NotNext stay 50/50 as the
                # paper describes.
                if len(chunk) >= 2:
                    a_end = int(rng.integers(1, len(chunk)))
                    a = [t for s in chunk[:a_end] for t in s]
                    b: list[int] = []
                    random_doc = None
                    if len(documents) > 1 and rng.random() < 0.5:
                        random_doc = int(rng.integers(0, len(documents) - 1))
                        random_doc += random_doc >= d  # never A's own document
                        other = documents[random_doc]
                        start = int(rng.integers(0, len(other)))
                        for sentence in other[start:]:
                            b.extend(sentence)
                            if len(b) >= target - len(a):
                                break
                        i -= len(chunk) - a_end  # the unused sentences go back
                    else:
                        b = [t for s in chunk[a_end:] for t in s]
                    a, b = list(a), list(b)
                    _truncate_pair(a, b, max_tokens, rng)
                    if a and b:
                        tokens = [cls_id] + a + [sep_id] + b + [sep_id]
                        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                        out.append(PairInstance(tokens, segments, random_doc is not None, d,
                                                random_doc))
                chunk, length = [], 0
            i += 1
    return out


def mask_tokens(tokens: Sequence[int], special_ids: Sequence[int], mask_id: int,
                vocab_size: int, max_predictions: int, rng: np.random.Generator,
                pieces: Sequence[str] | None = None,
                whole_word: bool = False) -> tuple[list[int], list[int], list[int]]:
    """(masked tokens, predicted positions (sorted), original ids at those positions)."""
    tokens = list(tokens)
    special = set(special_ids)
    words: list[list[int]] = []
    for pos, tok in enumerate(tokens):
        if tok in special:
            continue
        continues = whole_word and pieces is not None and pieces[tok].startswith("##")
        if continues and words and words[-1][-1] == pos - 1:
            words[-1].append(pos)
        else:
            words.append([pos])
    num_candidates = sum(len(w) for w in words)
    num_to_predict = min(max_predictions, max(1, int(round(num_candidates * MASK_PROB))))
    chosen: list[int] = []
    for index in rng.permutation(len(words)):
        word = words[index]
        if len(chosen) + len(word) > num_to_predict:
            continue
        chosen.extend(word)
        if len(chosen) >= num_to_predict:
            break
    chosen.sort()
    labels = [tokens[p] for p in chosen]
    for pos in chosen:
        draw = rng.random()
        if draw < 0.8:
            tokens[pos] = mask_id
        elif draw < 0.9:
            tokens[pos] = int(rng.integers(0, vocab_size))
        # else: keep the original token
    return tokens, chosen, labels
