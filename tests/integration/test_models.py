"""Bring your own model: "package.module:factory" with model_args trains through every
strategy that runs on CPU, and each way a factory can be broken is one clear error."""

import math

import jsonschema
import pytest

from conftest import ROOT, metrics_of, spec, state_of, train
from cifarflow.config import TrainConfig
from cifarflow.schema import schema
from cifarflow.engine.models import check_model

EXAMPLE = "examples.my_model:small_cnn"  # examples/my_model.py, imported from ROOT


@pytest.mark.parametrize("strategy, nproc", [("cpu", 1), ("ddp", 2), ("fsdp", 2),
                                             ("lightning", 2)])
def test_example_model_trains_through_every_cpu_strategy(cifar_dir, tmp_path, monkeypatch,
                                                         strategy, nproc):
    monkeypatch.chdir(ROOT)  # the workflow's directory: where the jobs import it from
    out = tmp_path / "segment-1"
    run = train(cifar_dir, out, threads=1 if nproc > 1 else 2, nproc=nproc, spec_kw={
        "strategy": strategy, "model": EXAMPLE, "model_args": {"width": 8}, "epochs": 1})
    assert f"model={EXAMPLE}" in run.stdout
    [record] = metrics_of(out)
    assert math.isfinite(record["train_loss"]) and 0.0 <= record["test_acc"] <= 1.0
    if strategy == "fsdp":  # no shard_units(), no layer1..4: one FSDP unit, said once
        assert run.stdout.count("sharded as one unit") == 1
    else:  # model_args reached the factory: the first conv has `width` filters
        assert state_of(out)["model"]["0.0.weight"].shape[0] == 8


def test_model_args_shape_the_run(monkeypatch):
    monkeypatch.chdir(ROOT)  # where planning imports the model from
    narrow = TrainConfig.read(spec(model=EXAMPLE, model_args={"width": 8}))
    wide = TrainConfig.read(spec(model=EXAMPLE, model_args={"width": 16}))
    assert narrow.shaping_hash() != wide.shaping_hash()
    assert wide.shaping_diff(narrow.to_dict()) == {"model_args": ({"width": 8}, {"width": 16})}


def test_model_args_of_a_registered_model_are_refused():
    with pytest.raises(ValueError, match="model_args apply to a module:factory model only; "
                                         "lenet takes none"):
        spec(model="lenet", model_args={"width": 8})


def test_schema_takes_registered_names_and_module_factory_paths():
    for model in ("lenet", "resnet18", EXAMPLE, "mypkg.nets.cifar:Net"):
        jsonschema.validate({"strategies": ["cpu"], "train": {"model": model},
                             "sweep": {"model": ["lenet", model]}}, schema())
    for model in ("lenet18", "my model:make", "mypkg.nets", "mypkg.:make", "mypkg:"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"strategies": ["cpu"], "train": {"model": model}}, schema())
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"strategies": ["cpu"], "sweep": {"model": [model]}}, schema())


BAD_MODELS = '''
import torch.nn as nn

NOT_CALLABLE = 3


def returns_int():
    return 3


def raises():
    raise RuntimeError("cannot build here\\nsecond line")


def forward_fails():
    return nn.Linear(7, 10)


def wrong_shape():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 5))


class Views(nn.Module):  # .view: fine on contiguous batches, not on channels_last ones
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 10)

    def forward(self, x):
        return self.fc(x.view(x.size(0), -1))


def small(width=4):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.Linear(width, 10))
'''


@pytest.fixture
def bad_models(tmp_path, monkeypatch):
    (tmp_path / "cifarflow_bad_models.py").write_text(BAD_MODELS)
    monkeypatch.syspath_prepend(tmp_path)


@pytest.mark.parametrize("name, args, message", [
    ("no_such_package.nets:make", {},
     "train.model 'no_such_package.nets:make': cannot import no_such_package.nets "
     "(ModuleNotFoundError: No module named 'no_such_package'); put it under "),
    ("cifarflow_bad_models:missing", {}, "cifarflow_bad_models.py) has no attribute 'missing'"),
    ("cifarflow_bad_models:NOT_CALLABLE", {}, "cifarflow_bad_models.NOT_CALLABLE is not callable"),
    ("cifarflow_bad_models:returns_int", {},
     "train.model cifarflow_bad_models:returns_int() returned int, not a torch.nn.Module"),
    ("cifarflow_bad_models:raises", {},
     "train.model cifarflow_bad_models:raises() failed: RuntimeError: cannot build here"),
    ("cifarflow_bad_models:small", {"depth": 2},
     "train.model cifarflow_bad_models:small(**{'depth': 2}) failed: TypeError: "),
    ("cifarflow_bad_models:forward_fails", {},
     "forward_fails(): forward pass on a (2, 3, 32, 32) batch failed: RuntimeError: "),
    ("cifarflow_bad_models:wrong_shape", {},
     "wrong_shape() maps a (2, 3, 32, 32) batch to (2, 5); CIFAR-10 needs (2, 10)"),
])
def test_each_broken_factory_is_one_clear_error(bad_models, name, args, message):
    with pytest.raises(ValueError) as err:
        check_model(name, args)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_model_that_cannot_take_channels_last_batches_is_refused_with_the_way_out(bad_models):
    check_model("cifarflow_bad_models:Views", {})  # contiguous: fine
    with pytest.raises(ValueError) as err:
        check_model("cifarflow_bad_models:Views", {}, channels_last=True)
    assert str(err.value).startswith(
        "train.model cifarflow_bad_models:Views(): forward pass fails on a channels_last batch "
        "(train.channels_last: true, the default): RuntimeError: view size is not compatible")
    assert str(err.value).endswith("or set train.channels_last: false")
    assert "\n" not in str(err.value)


def test_working_factories_pass(bad_models, monkeypatch):
    monkeypatch.chdir(ROOT)
    check_model("cifarflow_bad_models:small", {"width": 3})
    check_model(EXAMPLE, {"width": 4}, channels_last=True)
    check_model("lenet", {})
    with pytest.raises(ValueError, match="unknown model 'lenet5'"):
        check_model("lenet5", {})
