"""BERT's pretraining examples (Devlin et al., 2018, section 3.1 and appendix A.1), following
the reference `create_pretraining_data.py` (Google BERT, bert-tensorflow 1.0.4) function for
function:

* `sentence_pair_instances` (the reference's `create_instances_from_document`, for every
  document of a group): `[CLS] A [SEP] B [SEP]` pairs. A is one or more whole sentences; B is
  the actual next text (IsNext, label 0) or, with probability 1/2, text from a random
  document of the whole group (NotNext, label 1; drawn uniformly, redrawn up to 10 times while
  it is A's own document), the unused sentences of A's document going back into the pool. A
  chunk of a single sentence has no next sentence inside it, so, as in the reference, it always
  becomes NotNext (the labels are then not exactly 50/50: ~57% NotNext on real documents);
  `skip_single_sentence_chunks=True` drops such chunks instead (a deliberate deviation, off by
  default). With probability 0.1 a shorter target length is drawn, so the model also sees
  short sequences. Pairs that are too long are truncated one token at a time from the longer
  side, at its front or back at random.
* `mask_tokens` (the reference's `create_masked_lm_predictions`): the number of predictions
  is 15% of all the sequence's tokens, [CLS]/[SEP] included, at most `max_predictions` (e.g. 20
  at length 128 and 80 at 512); they are drawn from the positions that are not [CLS]/[SEP]; of
  those 80% become [MASK], 10% a random token, 10% stay. With `whole_word` all pieces of a
  word (a piece and its '##' continuations) are chosen together (the reference's later
  `do_whole_word_mask`).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

MASK_PROB = 0.15
NOT_NEXT, IS_NEXT = 1, 0
# The reference redraws the random document this many times while it is A's own.
RANDOM_DOCUMENT_TRIES = 10


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


def random_document(num_documents: int, own: int, rng: np.random.Generator) -> int:
    """The reference's draw of B's document: uniform over all documents, redrawn up to 10
    times while it is A's own (so it stays A's own only in a corpus of one document)."""
    for _ in range(RANDOM_DOCUMENT_TRIES):
        index = int(rng.integers(0, num_documents))
        if index != own:
            break
    return index


def sentence_pair_instances(
    documents: Sequence[Sequence[Sequence[int]]],
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    rng: np.random.Generator,
    short_seq_prob: float = 0.1,
    skip_single_sentence_chunks: bool = False,
) -> list[PairInstance]:
    """Every document's sentence-pair instances, the random B drawn from all `documents`."""
    out: list[PairInstance] = []
    for d in range(len(documents)):
        out += document_instances(
            documents,
            d,
            max_seq_length,
            cls_id,
            sep_id,
            rng,
            short_seq_prob,
            skip_single_sentence_chunks,
        )
    return out


def document_instances(
    documents: Sequence[Sequence[Sequence[int]]],
    d: int,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    rng: np.random.Generator,
    short_seq_prob: float = 0.1,
    skip_single_sentence_chunks: bool = False,
) -> list[PairInstance]:
    """Document `d`'s instances (the reference's `create_instances_from_document`)."""
    document = documents[d]
    max_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
    target = max_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))
    out: list[PairInstance] = []
    chunk: list[Sequence[int]] = []
    length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            if len(chunk) >= 2 or not skip_single_sentence_chunks:
                a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                b: list[int] = []
                other = None
                if len(chunk) == 1 or rng.random() < 0.5:  # random next
                    other = random_document(len(documents), d, rng)
                    sentences = documents[other]
                    for sentence in sentences[int(rng.integers(0, len(sentences))) :]:
                        b.extend(sentence)
                        if len(b) >= target - len(a):
                            break
                    i -= len(chunk) - a_end  # the unused sentences go back
                else:
                    b = [t for s in chunk[a_end:] for t in s]
                _truncate_pair(a, b, max_tokens, rng)
                if a and b:
                    tokens = [cls_id] + a + [sep_id] + b + [sep_id]
                    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
                    out.append(PairInstance(tokens, segments, other is not None, d, other))
            chunk, length = [], 0
        i += 1
    return out


def num_to_predict(length: int, max_predictions: int) -> int:
    """The reference's count: 15% of all `length` tokens ([CLS]/[SEP] included), rounded,
    at least 1 and at most `max_predictions`."""
    return min(max_predictions, max(1, int(round(length * MASK_PROB))))


# Features are padded with id 0, and a 0 reads as padding (the attention mask, the unpadded
# length), so a random replacement must never be 0.
PADDING_ID = 0


def random_token(vocab_size: int, rng: np.random.Generator, padding_id: int = PADDING_ID) -> int:
    """The 10% random replacement: uniform over the vocabulary's ids but `padding_id`. The
    reference draws `vocab_words[rng.randint(0, len(vocab_words) - 1)]`, uniform over every
    word, [PAD] and the other specials included, and the word [PAD] stays an attended token
    there (its input_mask is 1). Here a 0 would hide the token from attention and cut the
    unpadded instance short (its final [SEP] dropped), so the draw is the reference's
    distribution given "not [PAD]"; [CLS], [SEP], [MASK], [UNK] stay drawable, as there."""
    token = int(rng.integers(0, vocab_size - 1))
    return token + int(token >= padding_id)


def mask_tokens(
    tokens: Sequence[int],
    special_ids: Sequence[int],
    mask_id: int,
    vocab_size: int,
    max_predictions: int,
    rng: np.random.Generator,
    pieces: Sequence[str] | None = None,
    whole_word: bool = False,
) -> tuple[list[int], list[int], list[int]]:
    """(masked tokens, predicted positions (sorted), original ids at those positions).

    `tokens` is one unpadded instance: the number predicted counts all of them, as the
    reference does; `special_ids` ([CLS], [SEP]) are never predicted."""
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
    wanted = num_to_predict(len(tokens), max_predictions)
    chosen: list[int] = []
    for index in rng.permutation(len(words)):
        word = words[index]
        if len(chosen) + len(word) > wanted:
            continue
        chosen.extend(word)
        if len(chosen) >= wanted:
            break
    chosen.sort()
    labels = [tokens[p] for p in chosen]
    for pos in chosen:
        draw = rng.random()
        if draw < 0.8:
            tokens[pos] = mask_id
        elif draw < 0.9:
            tokens[pos] = random_token(vocab_size, rng)
        # else: keep the original token
    return tokens, chosen, labels
