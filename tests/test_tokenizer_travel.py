"""The tokenizer travels with the checkpoint: `convert --from_hf` keeps a HuggingFace
directory's tokenizer files (T5's spiece.model, BERT's vocab.txt, GPT-2's vocab.json +
merges.txt) in CKPT/tokenizer/, `tokenizer_files.vocabulary` makes the seqio vocabulary of
them, and `convert --to_hf` writes them back so that transformers' `AutoTokenizer` and
`AutoModel...from_pretrained` read the export together.

The reference is transformers' own tokenizers and models (the test extra's transformers): on
real text (Python's language reference, shipped with the interpreter) our vocabulary gives
their ids, and text -> ids -> model -> most likely next tokens -> text is the same on both
sides.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import convert
from t5x_like.checkpoints import params_io, tokenizer_files

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A for statement iterates over the items of any sequence, in order.",
    "Naïve café, 3.14 != 22/7; (spaces   and\ttabs)",
]


def _prose() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)[:60]]


def _round_trip(tmp_path):
    """HF dir -> ours (tokenizer kept) -> HF export: the three directories."""
    hf, ours, exported = tmp_path / "hf", tmp_path / "ours", tmp_path / "exported"
    assert convert.main(["--from_hf", str(hf), "--to", str(ours)]) == 0
    assert convert.main(["--from_ckpt", str(ours), "--to_hf", str(exported)]) == 0
    return hf, ours, exported


def _restored(directory):
    import jax

    return params_io.restore_config(str(directory)), jax.device_get(
        params_io.restore_saved_params(str(directory))
    )


def _hf_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_gpt2_tokenizer_and_model_travel_both_ways(tmp_path):
    from tokenizers import ByteLevelBPETokenizer

    from t5x_like.families.gpt.network import DecoderOnly

    learner = ByteLevelBPETokenizer()
    learner.train_from_iterator(_prose(), vocab_size=600, special_tokens=["<|endoftext|>"])
    (tmp_path / "hf").mkdir()
    learner.save_model(str(tmp_path / "hf"))
    tokenizer = transformers.GPT2Tokenizer(
        str(tmp_path / "hf" / "vocab.json"), str(tmp_path / "hf" / "merges.txt")
    )
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=4
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(str(tmp_path / "hf"))
    hf, ours, exported = _round_trip(tmp_path)

    vocabulary = tokenizer_files.vocabulary(str(ours))
    assert vocabulary is not None and vocabulary.eos_id == tokenizer.eos_token_id
    exported_tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    exported_model = transformers.AutoModelForCausalLM.from_pretrained(str(exported)).eval()
    cfg, params = _restored(ours)
    for text in TEXTS:
        ids = vocabulary.encode(text)
        assert ids == _hf_ids(tokenizer, text) == _hf_ids(exported_tokenizer, text)
        assert vocabulary.decode(ids) == text
        logits = DecoderOnly(cfg).apply({"params": params}, jnp.asarray([ids]))
        with torch.no_grad():
            reference = exported_model(torch.tensor([ids])).logits.numpy()
        np.testing.assert_allclose(np.asarray(logits), reference, atol=1e-4)
        ours_next = vocabulary.decode(np.argmax(np.asarray(logits)[0], -1).tolist())
        theirs_next = exported_tokenizer.decode(np.argmax(reference[0], -1).tolist())
        assert ours_next == theirs_next


def test_bert_vocab_travels_with_its_casing(tmp_path):
    from t5x_like.data import wordpiece

    pieces = [*wordpiece.SPECIAL_TOKENS, "The", "the", "quick", "brown", "fox", "##es", "."]
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "vocab.txt").write_text("\n".join(pieces) + "\n")
    tokenizer = transformers.BertTokenizer(str(tmp_path / "hf" / "vocab.txt"), do_lower_case=False)
    tokenizer.save_pretrained(str(tmp_path / "hf"))
    config = transformers.BertConfig(
        vocab_size=len(pieces),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    transformers.BertForPreTraining(config).save_pretrained(str(tmp_path / "hf"))
    hf, ours, exported = _round_trip(tmp_path)

    described = tokenizer_files.description(str(ours))
    assert described is not None and described["lower_case"] is False
    vocabulary = tokenizer_files.vocabulary(str(ours))
    exported_tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    transformers.AutoModelForPreTraining.from_pretrained(str(exported))
    for text in ("The quick foxes.", "the brown fox."):
        assert vocabulary.encode(text) == _hf_ids(tokenizer, text)
        assert _hf_ids(exported_tokenizer, text) == _hf_ids(tokenizer, text)


def test_bert_tasks_read_the_kept_vocab_by_default(tmp_path):
    """Fine-tuning or evaluating a converted BERT needs no vocabulary binding: with the
    checkpoint offered (train's INIT_CHECKPOINT, eval's CHECKPOINT), BERT's tasks read its
    kept vocab.txt with its casing, and the vocabulary check passes; ids equal transformers'
    BertTokenizer on that file (cased)."""
    import seqio

    from t5x_like import input_pipeline, tasks

    test_bert_vocab_travels_with_its_casing(tmp_path)
    ours = str(tmp_path / "ours")
    tokenizer = transformers.BertTokenizer(str(tmp_path / "hf" / "vocab.txt"), do_lower_case=False)
    task = seqio.get_mixture_or_task("bert_offline_word_order")
    try:
        assert tokenizer_files.offer_to_tasks(ours) is not None
        vocabulary = tasks.bert.BERT_VOCABULARY
        assert vocabulary.vocab_path == os.path.join(ours, "tokenizer", "vocab.txt")
        assert vocabulary.lower_case is False
        for text in ("The quick foxes.", "the brown fox."):
            assert vocabulary.encode(text) == _hf_ids(tokenizer, text)
        input_pipeline.check_checkpoint_vocabulary(task, ours)  # no refusal
    finally:
        tokenizer_files.offer_to_tasks(None)
    assert tokenizer_files.offered("wordpiece") is None


def _t5_tokenizer(directory):
    """A HF T5 directory's tokenizer: a 300-piece spiece.model learnt from real prose, read by
    transformers (which then saves the hub's tokenizer files beside it), with 100 extra ids."""
    _spm(directory, "spiece", 300, _prose())
    tokenizer = transformers.T5Tokenizer.from_pretrained(str(directory), extra_ids=100)
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def test_t5_sentencepiece_travels_with_its_extra_ids(tmp_path):
    import sentencepiece as spm

    tokenizer = _t5_tokenizer(tmp_path / "hf")
    pieces = spm.SentencePieceProcessor(model_file=str(tmp_path / "hf" / "spiece.model"))
    config = transformers.T5Config(
        vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2
    )
    transformers.T5ForConditionalGeneration(config).save_pretrained(str(tmp_path / "hf"))
    hf, ours, exported = _round_trip(tmp_path)

    vocabulary = tokenizer_files.vocabulary(str(ours))
    assert vocabulary is not None and vocabulary.vocab_size == len(tokenizer) == 400
    exported_tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    transformers.AutoModelForSeq2SeqLM.from_pretrained(str(exported))
    assert json.loads((exported / "tokenizer_config.json").read_text())["extra_ids"] == 100
    for text in TEXTS[:2]:
        ids = vocabulary.encode(text)
        assert ids == pieces.encode(text)
        assert ids == _hf_ids(tokenizer, text) == _hf_ids(exported_tokenizer, text)
        assert vocabulary.decode(ids) == tokenizer.decode(ids)


# ------------------------------------------------------------------ vocabulary agreement
def _spm(directory, name, vocab_size, texts):
    import sentencepiece as spm

    directory.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(directory / name),
        vocab_size=vocab_size,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
    )
    return str(directory / f"{name}.model")


def _task(name, vocabulary):
    import seqio
    import tensorflow as tf

    seqio.TaskRegistry.remove(name)
    return seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(
            lambda split, shuffle_files: tf.data.Dataset.from_tensors({"inputs": "x"}),
            splits=["train"],
        ),
        preprocessors=[],
        output_features={
            "inputs": seqio.Feature(vocabulary),
            "targets": seqio.Feature(vocabulary),
        },
    )


def test_a_task_on_another_vocabulary_than_the_checkpoints_is_refused(tmp_path):
    """Both ways: a smaller vocabulary, one of the same size learnt from other text, and the
    same pieces with other extra ids are each refused, naming both; the checkpoint's own
    SentencePiece model, from another path, is accepted."""
    import seqio

    from t5x_like import input_pipeline
    from t5x_like.errors import ConfigError

    prose = _prose()
    own = _spm(tmp_path / "release", "spiece", 300, prose)
    tokenizer_files.save(
        str(tmp_path / "ckpt"),
        {"spiece.model": own},
        {"type": "sentencepiece", "file": "spiece.model", "extra_ids": 100},
    )
    copy = tmp_path / "elsewhere" / "copy.model"
    copy.parent.mkdir()
    copy.write_bytes(open(own, "rb").read())
    task = _task("tokenizer_travel_same", seqio.SentencePieceVocabulary(str(copy), extra_ids=100))
    input_pipeline.check_checkpoint_vocabulary(task, str(tmp_path / "ckpt"))

    others = {
        "smaller": seqio.SentencePieceVocabulary(
            _spm(tmp_path / "other", "small", 200, prose), extra_ids=100
        ),
        "same_size_other_text": seqio.SentencePieceVocabulary(
            _spm(tmp_path / "other", "reversed", 300, [t[::-1] for t in prose]), extra_ids=100
        ),
        "other_extra_ids": seqio.SentencePieceVocabulary(str(copy), extra_ids=0),
    }
    for name, vocabulary in others.items():
        task = _task(f"tokenizer_travel_{name}", vocabulary)
        with pytest.raises(ConfigError) as refused:
            input_pipeline.check_checkpoint_vocabulary(task, str(tmp_path / "ckpt"))
        message = str(refused.value)
        assert "tokenizer/spiece.model" in message, name  # the checkpoint's, named
        assert str(vocabulary.sentencepiece_model_file) in message, name  # and the task's


def _infer_argv(checkpoint, input_file, output_file) -> list[str]:
    """infer's command line for a converted checkpoint without a task: its architecture bound
    from the config saved with it, reading `input_file`, writing `output_file`."""
    import dataclasses

    config = params_io.restore_config(str(checkpoint))
    return [
        "--gin_file=gin_configs/runs/infer.gin",
        f"--gin.CHECKPOINT={checkpoint}",
        f"--gin.infer.input_file={input_file}",
        f"--gin.infer.output_file={output_file}",
        *(
            f"--gin.{type(config).__name__}.{f.name}={getattr(config, f.name)!r}"
            for f in dataclasses.fields(config)
            if f.name in type(config).ARCHITECTURE_FIELDS
        ),
    ]


def test_infer_without_a_task_reads_with_the_checkpoints_tokenizer(tmp_path):
    """text -> ids -> model -> text on both sides: `infer` on an imported T5 with no task reads
    the input file with the tokenizer kept beside the checkpoint and writes what transformers'
    `generate(do_sample=False)` and its tokenizer give for the same text."""

    import torch

    from t5x_like import infer

    tokenizer = _t5_tokenizer(tmp_path / "hf")
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=len(tokenizer),
            d_model=16,
            d_kv=8,
            d_ff=32,
            num_layers=2,
            num_heads=2,
            decoder_start_token_id=0,
            eos_token_id=1,
            pad_token_id=0,
        )
    ).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(str(tmp_path / "hf"))
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ours")]) == 0

    texts = TEXTS[:2]
    (tmp_path / "inputs.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.jsonl"
    argv = [
        *_infer_argv(tmp_path / "ours", tmp_path / "inputs.txt", out),
        "--gin.infer.task_feature_lengths={'inputs': 128, 'targets': 8}",
    ]
    assert infer.main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for record, text in zip(records, texts):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            generated = model.generate(ids, do_sample=False, max_new_tokens=8)
        # The ids between the start (pad) token and EOS, sentinels included: both sides spell
        # a sentinel <extra_id_N>, but seqio puts a space before one that follows a word and
        # transformers' tokenizer does not, the one difference of rendering, left out here.
        new_ids = [t for t in generated[0].tolist()[1:] if t != tokenizer.eos_token_id]
        assert record["inputs"] == text
        assert _sentinels_joined(record["prediction"]) == _sentinels_joined(
            tokenizer.decode(new_ids)
        )


def _sentinels_joined(text: str) -> str:
    import re

    return re.sub(r"\s*(<extra_id_\d+>)\s*", r"\1", text)


def test_infer_on_an_imported_gpt2_continues_prompts_as_transformers_does(tmp_path):
    """`infer` with no task on an imported GPT-2 decodes with the model's own conventions (no
    start token, its `<|endoftext|>` as EOS, causal attention over the prompt, prompts padded
    by length though id 0 is '!') and writes the text transformers' `generate(do_sample=False)`
    and GPT2Tokenizer give, with the same log-probability."""

    from tokenizers import ByteLevelBPETokenizer

    from t5x_like import infer

    learner = ByteLevelBPETokenizer()
    learner.train_from_iterator(_prose(), vocab_size=400)
    (tmp_path / "hf").mkdir()
    learner.save_model(str(tmp_path / "hf"))
    vocab_file, merges_file = tmp_path / "hf" / "vocab.json", tmp_path / "hf" / "merges.txt"
    entries = json.loads(vocab_file.read_text())
    entries["<|endoftext|>"] = len(entries)  # last, as GPT-2's 50256; id 0 is the byte '!'
    vocab_file.write_text(json.dumps(entries))
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=len(entries), n_positions=64, n_embd=32, n_layer=2, n_head=4
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # peaked next-token distributions: greedy is well defined

    prompts = ["Wow!! It works!", "The items of any sequence", "!"]
    # Move <|endoftext|> to the id the first prompt's greedy continuation reaches mid-way (one
    # no prompt uses), so a continuation ends early at the model's own EOS.
    tokenizer = transformers.GPT2Tokenizer(str(vocab_file), str(merges_file))
    prompt_ids = {t for text in prompts for t in tokenizer(text)["input_ids"]}
    ids = tokenizer(prompts[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        continuation = model.generate(ids, do_sample=False, max_new_tokens=12, pad_token_id=0)
    eos = next(
        int(t)
        for t in continuation[0, ids.shape[1] + 2 :]
        if int(t) not in prompt_ids | {0, len(entries) - 1}
    )
    by_id = {i: token for token, i in entries.items()}
    by_id[eos], by_id[len(entries) - 1] = "<|endoftext|>", by_id[eos]
    vocab_file.write_text(json.dumps({token: i for i, token in by_id.items()}))
    tokenizer = transformers.GPT2Tokenizer(str(vocab_file), str(merges_file))
    assert tokenizer.convert_ids_to_tokens(0) == "!" and tokenizer.eos_token_id == eos
    model.config.bos_token_id = model.config.eos_token_id = eos
    model.save_pretrained(str(tmp_path / "hf"))
    assert convert.main(["--from_hf", str(tmp_path / "hf"), "--to", str(tmp_path / "ours")]) == 0

    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    out = tmp_path / "out.jsonl"
    argv = [
        *_infer_argv(tmp_path / "ours", tmp_path / "prompts.txt", out),
        "--gin.infer.model_class=@DecoderOnlyModel",
        "--gin.infer.add_eos=False",
        "--gin.infer.task_feature_lengths={'inputs': 16, 'targets': 12}",
    ]
    assert infer.main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ended = 0
    for record, text in zip(records, prompts, strict=True):
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        assert 0 in ids[0].tolist() or text != "!"
        with torch.no_grad():
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=12,
                eos_token_id=eos,
                pad_token_id=eos,
                output_scores=True,
                return_dict_in_generate=True,
            )
        new_ids = generated.sequences[0, ids.shape[1] :].tolist()
        # The continuation's log-probability (EOS included), as infer's "score" sums it.
        log_probs = [
            torch.log_softmax(step[0], -1)[t].item() for step, t in zip(generated.scores, new_ids)
        ]
        ended += eos in new_ids
        new_ids = new_ids[: new_ids.index(eos)] if eos in new_ids else new_ids
        assert record["inputs"] == text
        assert record["prediction"] == tokenizer.decode(new_ids)
        assert record["score"] == pytest.approx(sum(log_probs), abs=1e-4)
    assert ended  # some continuation stopped at the model's own EOS


def test_a_runs_tokenizer_is_found_from_its_best_dir_and_nowhere_else(tmp_path):
    """find: a converted directory, a run's MODEL_DIR (checkpoints/tokenizer, the copy
    carry_into_run writes) or its best/<task>; never a sibling's grandparent. A run's copy
    of a GPT-2 tokenizer gives no imported-model conventions: the run decodes as trained."""
    run = tmp_path / "run"
    tokenizer_files.save(str(run / "checkpoints"), {}, {"type": "gpt2_bpe"})
    assert tokenizer_files.find(str(run)) == str(run / "checkpoints")
    assert tokenizer_files.find(str(run / "best" / "some_task")) == str(run / "checkpoints")
    assert tokenizer_files.find(str(tmp_path / "sweep1")) is None  # tmp_path/checkpoints: none
    assert tokenizer_files.find(str(run / "other" / "x")) is None
    assert tokenizer_files.model_conventions(str(run)) is None
