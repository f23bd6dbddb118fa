"""The bad-input catalogue for `python -m t5x_like.convert` and `python -m t5x_like.infer`:
each broken file is refused with exit code 2 and one `error:` line that names the file (and
the line) and says what to do, before a model is restored or anything is written."""

from __future__ import annotations

import os

import pytest

from t5x_like import convert, infer

GPT_SIZE = [
    "--gin.GPTConfig.vocab_size=2048",
    "--gin.GPTConfig.max_position_embeddings=64",
    "--gin.GPTConfig.hidden_size=16",
    "--gin.GPTConfig.num_layers=1",
    "--gin.GPTConfig.num_heads=2",
    "--gin.GPTConfig.intermediate_size=32",
]


def _one_error_line(capsys) -> str:
    """The one `error:` line (gin's own "In call to configurable 'infer'" note, which it
    appends to any error raised inside a configurable, is allowed after it)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert err.startswith("error: "), err[-2000:]
    assert all(line.startswith("  In call to configurable") for line in lines[1:]), err
    return lines[0]


# ------------------------------------------------------------------------------ convert
@pytest.fixture(scope="module")
def sharded_checkpoints(tmp_path_factory):
    """One tiny T5 saved by transformers in 50 KB shards, as safetensors and as .bin files
    (each with its index), plus the torch model they came from."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.test_hf_parity import _make_hf_checkpoint

    base = tmp_path_factory.mktemp("sharded")
    model = _make_hf_checkpoint(base / "single", "v1_1_gated_gelu_untied")
    model.save_pretrained(str(base / "safetensors"), max_shard_size="50KB")
    _save_sharded_bin(model, base / "bin", shards=3)
    return base, model


def _save_sharded_bin(model, directory, shards: int) -> None:
    """The layout older transformers versions write with safe_serialization=False (5.x writes
    safetensors only): `pytorch_model-0000K-of-0000N.bin` files of torch.save'd tensors and
    `pytorch_model.bin.index.json` mapping each tensor name to its file."""
    import json

    import torch

    directory.mkdir()
    (directory / "config.json").write_text(model.config.to_json_string())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = sorted(state)
    weight_map = {}
    for k in range(shards):
        file = f"pytorch_model-{k + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[k::shards]}
        torch.save(part, directory / file)
        weight_map.update(dict.fromkeys(part, file))
    (directory / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )


def _copy(source, destination):
    import shutil

    shutil.copytree(source, destination)
    return destination


def _shards(directory, suffix):
    return sorted(n for n in os.listdir(directory) if n.endswith(suffix) and "-of-" in n)


@pytest.mark.parametrize(
    "kind,suffix,index",
    [
        ("safetensors", ".safetensors", "model.safetensors.index.json"),
        ("bin", ".bin", "pytorch_model.bin.index.json"),
    ],
)
def test_a_missing_weight_shard_is_named(
    sharded_checkpoints, tmp_path, capsys, kind, suffix, index
):
    base, _ = sharded_checkpoints
    hf = _copy(base / kind, tmp_path / "hf")
    shards = _shards(hf, suffix)
    assert len(shards) >= 3 and (hf / index).exists()  # really sharded, with its index
    os.remove(hf / shards[1])
    assert convert.main(["--from_hf", str(hf), "--to", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert f"{hf / index} lists {len(shards)} shard(s), but 1 are not in {hf}: {shards[1]}" in err
    assert "fetch the missing file(s) again" in err
    assert not (tmp_path / "out").exists()


def test_a_truncated_shard_is_named(sharded_checkpoints, tmp_path, capsys):
    base, _ = sharded_checkpoints
    hf = _copy(base / "safetensors", tmp_path / "hf")
    shard = hf / _shards(hf, ".safetensors")[0]
    shard.write_bytes(shard.read_bytes()[:100])
    assert convert.main(["--from_hf", str(hf), "--to", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert f"{shard} is not a readable safetensors file" in err and "fetch it again" in err


def test_a_shard_cut_inside_its_tensor_data_is_named_before_any_shard_is_read(
    sharded_checkpoints, tmp_path, capsys
):
    """The header (an 8-byte length, then JSON whose `data_offsets` end at the data's size:
    the safetensors format) promises more bytes than the file holds: named up front, with
    the counts, before a progress bar or a tensor."""
    import json

    base, _ = sharded_checkpoints
    hf = _copy(base / "safetensors", tmp_path / "hf")
    shard = hf / _shards(hf, ".safetensors")[-1]
    whole = shard.read_bytes()
    header_bytes = int.from_bytes(whole[:8], "little")
    data = max(
        e["data_offsets"][1]
        for k, e in json.loads(whole[8 : 8 + header_bytes]).items()
        if k != "__metadata__"
    )
    assert len(whole) == 8 + header_bytes + data  # the layout as the format defines it
    shard.write_bytes(whole[:-10])
    assert convert.main(["--from_hf", str(hf), "--to", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert (
        f"{shard} is not a readable safetensors file (it holds {data - 10} of the {data} "
        "bytes of tensor data its header lists); it may be truncated: fetch it again."
    ) in err
    assert not (tmp_path / "out").exists()


def test_a_header_length_past_safetensors_limit_is_refused_unread(
    sharded_checkpoints, tmp_path, capsys
):
    """A damaged length (here 200 MB, above safetensors' 100 MB MAX_HEADER_SIZE) in a file
    big enough to hold it (sparse) is named, not read into memory."""
    base, _ = sharded_checkpoints
    hf = _copy(base / "single", tmp_path / "hf")
    with open(hf / "model.safetensors", "r+b") as f:
        f.write((200_000_000).to_bytes(8, "little"))
        f.truncate(300_000_000)
    assert convert.main(["--from_hf", str(hf), "--to", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert (
        f"{hf / 'model.safetensors'} is not a readable safetensors file (300000000 "
        "bytes; its header length says 200000000)"
    ) in err


def test_a_shard_that_cannot_be_opened_is_named(sharded_checkpoints, tmp_path, capsys):
    base, _ = sharded_checkpoints
    hf = _copy(base / "single", tmp_path / "hf")
    os.remove(hf / "model.safetensors")
    os.mkdir(hf / "model.safetensors")  # a directory where the file should be
    assert convert.main(["--from_hf", str(hf), "--to", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert f"{hf / 'model.safetensors'} cannot be read (Is a directory)" in err


def test_sharded_pytorch_bin_checkpoint_imports(sharded_checkpoints):
    """The shards a `pytorch_model.bin.index.json` lists are read (weights-only) as a whole:
    the output layer equals transformers' own lm_head, transposed."""
    from t5x_like.families.t5 import hf as hf_t5

    base, model = sharded_checkpoints
    _, params = hf_t5.load_hf_checkpoint(str(base / "bin"))
    expected = model.lm_head.weight.detach().numpy().T
    assert (params["decoder"]["logits_dense"]["kernel"] == expected).all()


@pytest.mark.parametrize(
    "text,expected",
    [
        (b'{"model_type": "t5",\n  "d_model": 48,,\n}', "config.json:2: not valid JSON"),
        (b"\x89PNG\r\n\x1a\n", "config.json is not UTF-8 text (byte 0x89 at offset 0)"),
        (b"[1, 2]", "config.json holds a JSON list, not an object"),
    ],
)
def test_an_unreadable_config_json_is_named(sharded_checkpoints, tmp_path, capsys, text, expected):
    base, _ = sharded_checkpoints
    hf = _copy(base / "single", tmp_path / "hf")
    (hf / "config.json").write_bytes(text)
    assert convert.main(["--from_hf", str(hf), "--to", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert f"{hf}/{expected}" in err and "fetch or re-save it" in err


# -------------------------------------------------------------------------------- infer
def _infer(tmp_path, input_name: str, content: bytes, *args, gpt=False):
    """infer.main on a file of prompts; the checkpoint is never read (the input is checked
    first), so a path that does not exist stands for it."""
    (tmp_path / input_name).write_bytes(content)
    model = (
        [
            "--gin.INFER_TASK=offline_lm",
            "--gin.infer.model_class=@DecoderOnlyModel",
            "--gin.infer.add_eos=False",
            *GPT_SIZE,
        ]
        if gpt
        else ["--gin.INFER_TASK=offline_first_word"]
    )
    return infer.main(
        [
            "--gin_file=gin_configs/runs/infer.gin",
            f"--gin.CHECKPOINT={tmp_path}/never_read",
            *model,
            f"--gin.infer.input_file={tmp_path / input_name}",
            *args,
        ]
    )


def test_a_non_utf8_prompt_line_is_named(tmp_path, capsys):
    assert _infer(tmp_path, "p.txt", b"first word: one\nfirst word: two\ncaf\xe9 noir\n") == 2
    err = _one_error_line(capsys)
    assert f"{tmp_path}/p.txt:3: not UTF-8 text (byte 0xe9 at column 4)" in err
    assert "iconv" in err


@pytest.mark.parametrize(
    "line,expected",
    [
        (b'{"inputs": "two"', "not valid JSON (Expecting ',' delimiter at column 17)"),
        (b'["two"]', "has no 'inputs' field"),
        (b'{"inputs": 2}', "'inputs' is a JSON int, not a string"),
    ],
)
def test_a_malformed_jsonl_line_is_named(tmp_path, capsys, line, expected):
    assert _infer(tmp_path, "p.jsonl", b'{"inputs": "one"}\n' + line + b"\n") == 2
    err = _one_error_line(capsys)
    assert f"{tmp_path}/p.jsonl:2" in err and expected in err
    assert '{"inputs": "..."}' in err


def test_an_input_file_without_prompts_is_refused(tmp_path, capsys):
    assert _infer(tmp_path, "p.txt", b"\n  \n\n") == 2
    err = _one_error_line(capsys)
    assert f"infer.input_file {tmp_path}/p.txt has no prompts: every line is blank" in err
    assert not (tmp_path / "never_read").exists()


def test_gpt_feature_lengths_past_the_learned_positions_are_refused(tmp_path, capsys):
    """infer.gin's default lengths (512 + 114) with a 64-position model: refused before the
    model is restored, naming the binding and the limit (was a traceback from the model)."""
    assert _infer(tmp_path, "p.txt", b"The river\n", gpt=True) == 2
    err = _one_error_line(capsys)
    assert (
        "infer.task_feature_lengths={'inputs': 512, 'targets': 114} decodes 1 + 512 + 114 "
        "= 627 positions"
    ) in err
    assert "the model has 64 learned positions (GPTConfig.max_position_embeddings)" in err
    # 'targets' cut to half of the 63 positions after the start token, the rest the prompt's
    assert "e.g. --gin.infer.task_feature_lengths=\"{'inputs': 32, 'targets': 31}\"" in err


def test_a_gpt_prompt_longer_than_its_room_is_refused_naming_the_line(tmp_path, capsys):
    """Lengths that fit (1 + 16 + 8 <= 64), but line 2's prompt is longer than 16 tokens: a
    cut would continue from its middle. The error names the line and how far 'inputs' can
    go (64 - 1 - 8 = 55)."""
    long_prompt = " ".join(["river boats sail"] * 30).encode()
    assert (
        _infer(
            tmp_path,
            "p.txt",
            b"The river\n" + long_prompt + b"\n",
            "--gin.infer.task_feature_lengths={'inputs': 16, 'targets': 8}",
            gpt=True,
        )
        == 2
    )
    err = _one_error_line(capsys)
    assert f"{tmp_path}/p.txt:2: the prompt is " in err
    assert "longer than the 16 of infer.task_feature_lengths['inputs']" in err
    assert "(up to 55 with 'targets': 8: the model has 64 learned positions" in err


def test_infer_without_a_task_needs_the_checkpoints_tokenizer(tmp_path, capsys):
    """With no task, infer reads the input file with the tokenizer convert kept beside the
    checkpoint; a checkpoint without one is refused, saying so, before anything is loaded."""
    from t5x_like import infer

    (tmp_path / "inputs.txt").write_text("hello\n")
    argv = [
        "--gin_file=gin_configs/runs/infer.gin",
        f"--gin.CHECKPOINT={tmp_path / 'no_tokenizer'}",
        f"--gin.infer.input_file={tmp_path / 'inputs.txt'}",
    ]
    assert infer.main(argv) == 2
    err = capsys.readouterr().err
    assert "tokenizer saved beside the checkpoint" in err and "has none" in err
