"""train's settings in groups (`t5x_like.train_settings`): each group is bound by name, checks
its values as it is built, and every one of the 34 flat `train.*` parameters of before has a
home, so a gin file written for them is answered with the binding to write instead."""

from __future__ import annotations

import dataclasses
import inspect
import re

import gin
import pytest

from t5x_like import train, train_settings
from t5x_like.errors import ConfigError
from t5x_like.train_settings import MOVED, Data, Optimizer, Schedule

GROUPS = ("Data", "Schedule", "Optimizer", "Checkpointing", "Evaluation", "Health")


def test_every_former_flat_setting_has_one_home_and_train_takes_the_groups():
    """The issue counted 34 flat parameters of `train`; 29 moved into groups, the rest stay."""
    stays = {"model_dir", "model_class", "seed", "log_every", "profile_steps"}
    assert len(MOVED) + len(stays) == 34
    homes = set(MOVED.values())
    assert len(homes) == len(MOVED)  # no two old names share a new one
    for new in homes:
        group, field = new.split(".")
        assert group in GROUPS
        assert field in {f.name for f in dataclasses.fields(getattr(train_settings, group))}
    parameters = set(inspect.signature(train.train).parameters)
    assert parameters == stays | {g.lower() for g in GROUPS}
    # One old name is also a group's: `train.optimizer = 'adamw'` is refused in train (below).
    assert parameters & set(MOVED) == {"optimizer"}


def test_a_binding_of_the_group_reaches_the_group():
    gin.parse_config(
        ["Data.batch_size = 7", "Schedule.kind = 'cosine'", "Optimizer.kind = 'adamw'"]
    )
    assert Data().batch_size == 7
    assert Schedule().kind == "cosine" and Optimizer().kind == "adamw"


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Data(batch_size=0), "--gin.Data.batch_size must be >= 1, not 0."),
        (lambda: Data(shards=2.5), "--gin.Data.shards must be an integer >= 1 or None"),
        (
            lambda: Data(phases=((0.5, {"inputs": 8}), (0.4, {"inputs": 16}))),
            "Data.phases: the end fractions must increase",
        ),
        (lambda: Data(phases=((0.5, {"inputs": 8}),)), "the last phase must end at 1.0"),
        (lambda: Schedule(warmup_proportion=1.5), "Schedule.warmup_proportion must be"),
        (lambda: Schedule(kind="triangle"), "Schedule.kind='triangle'; choose one of"),
        (lambda: Optimizer(kind="sgd"), "Optimizer.kind='sgd'; choose one of"),
        (lambda: Optimizer(num_microbatches=0), "Optimizer.num_microbatches must be"),
        (lambda: train_settings.Checkpointing(keep=0), "Checkpointing.keep must be"),
        (lambda: train_settings.Evaluation(loss_every=-1), "Evaluation.loss_every must be"),
        (lambda: train_settings.Health(loss_spike_ratio=1.0), "Health.loss_spike_ratio must be"),
        (
            lambda: train_settings.Health(nonfinite_policy="ignore"),
            "Health.nonfinite_policy='ignore': choose one of stop, skip, none.",
        ),
        (
            lambda: train_settings.Health(inject_nonfinite_at_steps=5),
            "Health.inject_nonfinite_at_steps=5 must be a tuple of step numbers",
        ),
    ],
)
def test_a_group_refuses_a_bad_value_as_it_is_built(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


def test_epochs_and_warmup_proportion_become_steps():
    """BERT's run_classifier: int(examples / batch * epochs) steps, int(steps x 0.1) warm-up."""
    schedule = Schedule(train_epochs=3, warmup_proportion=0.1, warmup_steps=5).resolved(
        lambda epochs: int(3668 / 32 * epochs)  # MRPC's 3,668 training pairs at batch 32
    )
    assert (schedule.train_steps, schedule.warmup_steps) == (343, 34)
    assert Schedule(train_steps=9, warmup_steps=5).resolved(lambda _: 1 / 0).train_steps == 9


@pytest.mark.parametrize(
    "old, new",
    [("batch_size", "Data.batch_size"), ("eval_every", "Evaluation.loss_every")],
)
def test_a_gin_file_of_the_flat_settings_is_told_the_new_name(tmp_path, capsys, old, new):
    old_file = tmp_path / "old.gin"
    old_file.write_text(f"train.{old} = 8\n")
    assert train.main([f"--gin_file={old_file}", f"--gin.MODEL_DIR={tmp_path}/run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: train.{old} is now {new}:"), err
    assert str(old_file) in err  # gin's own words say where the binding is
    assert not (tmp_path / "run").exists()


def test_the_old_optimizer_binding_names_its_new_one(tmp_path, capsys):
    """`train.optimizer` is still a parameter (the Optimizer group), so gin accepts the old
    string; train refuses it before anything is written."""
    argv = ["--gin_file=gin_configs/runs/quickstart.gin", f"--gin.MODEL_DIR={tmp_path}/run"]
    assert train.main([*argv, "--gin.train.optimizer=adamw"]) == 2
    err = capsys.readouterr().err
    assert "bind Optimizer.kind instead (--gin.Optimizer.kind='adamw')" in err, err
    assert not (tmp_path / "run").exists()
