"""The knob benchmark times each knob against the plain step in the same rounds, and shows that
a knob changes speed and memory, not the step's result."""

import json
import shlex

import pytest

from benchmarks import knob_effect

TINY_T5 = (
    "--gin T5Config.vocab_size=256 --gin T5Config.emb_dim=32 --gin T5Config.num_heads=2 "
    "--gin T5Config.head_dim=16 --gin T5Config.mlp_dim=64 "
    "--gin T5Config.num_encoder_layers=2 --gin T5Config.num_decoder_layers=2 "
    "--gin T5Config.dropout_rate=0.0"
)


def test_knobs_interleaved_against_the_plain_step(tmp_path, capsys):
    out = tmp_path / "knobs.json"
    result = knob_effect.main(
        [
            "--base",
            TINY_T5,
            "--inputs",
            "32",
            "--targets",
            "16",
            "--rounds",
            "4",
            "--knob",
            "--loss_chunk_length 8",
            "--knob=--scan_layers",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    chunked, scanned = result["knobs"]
    assert [chunked["knob"], scanned["knob"]] == ["--loss_chunk_length 8", "--scan_layers"]
    for row in result["knobs"]:
        plain, knob = row["plain"], row["with_knob"]
        # Four A B B A rounds: two steps a side per round, one ratio per round.
        assert len(plain["steps_s"]) == len(knob["steps_s"]) == 8 and len(row["ratios"]) == 4
        assert row["ratio_q1"] <= row["ratio_median"] <= row["ratio_q3"]
        assert plain["xla_step_bytes"] > 0 and knob["xla_step_bytes"] > 0
        assert plain["compile_s"] > 0 and knob["compile_s"] > 0
        # Same weights, same batch: the chunked loss and the scanned stack compute the plain
        # step's loss (a scanned stack starts from the per-layer stack's weights, stacked).
        assert knob["first_loss"] == pytest.approx(plain["first_loss"], rel=1e-5)
    printed = capsys.readouterr().out
    assert "--loss_chunk_length 8" in printed and "knob/plain" in printed


@pytest.mark.parametrize(
    "knob,message",
    [("--remat_policy bogus", "remat_policy='bogus'"), ("--no_such_option 3", "is not a step")],
)
def test_a_bad_knob_fails_before_any_worker_starts(knob, message, monkeypatch, capsys):
    def no_worker(*args, **kwargs):
        raise AssertionError("a worker was started for a knob that cannot be built")

    monkeypatch.setattr(knob_effect, "_start_worker", no_worker)
    with pytest.raises(SystemExit, match=message):
        knob_effect.main(["--base", TINY_T5, "--knob", knob, "--out", "/dev/null"])


@pytest.mark.parametrize("family", sorted(knob_effect.DEFAULT_KNOBS))
def test_every_default_knob_builds_on_its_family(family):
    """Each family's default knobs parse and apply to its benchmark config (a knob the config
    lacks, e.g. BERT's chunked loss, would stop the default run before it starts)."""
    for knob in knob_effect.DEFAULT_KNOBS[family]:
        knob_effect.check_step_arguments(["--family", family, *shlex.split(knob)])
