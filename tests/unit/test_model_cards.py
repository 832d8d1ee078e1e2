"""One model registry: every registered model has one card (model_cards.py), and the card
says what its code builds (sizes) and where its factory is; train.augment: auto and the
storage estimate read the card; a user's model is measured where the plan builds it."""

import importlib

import pytest

from cifarflow.config import resolve_augment
from cifarflow.model_cards import CARDS, NO_AUGMENT, card_of


@pytest.mark.parametrize("name", sorted(CARDS))
def test_each_card_is_its_models_own(name):
    import torch

    from cifarflow.engine.models import MODELS

    card = CARDS[name]
    module, _, attr = card.factory.partition(":")
    assert getattr(importlib.import_module(module), attr) is MODELS[name]
    with torch.device("meta"):  # no memory: only the shapes
        model = MODELS[name]()
    assert card.sizes == (sum(p.numel() * p.element_size() for p in model.parameters()),
                          sum(b.numel() * b.element_size() for b in model.buffers()))
    assert resolve_augment(name, {}) == card.augment


def test_every_registered_model_has_a_card_and_no_card_lacks_its_model():
    from cifarflow.engine import models

    assert set(models.MODELS) == set(CARDS)
    with pytest.raises(ValueError, match="model 'nocard' has no card: add one to "
                                         "cifarflow/model_cards.py"):
        models.register("nocard")


def test_a_users_model_is_measured_where_the_plan_builds_it(tmp_path, monkeypatch):
    from cifarflow.engine.models import check_model

    (tmp_path / "mynets.py").write_text(
        "import torch.nn as nn\n"
        "def tiny():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))\n")
    monkeypatch.chdir(tmp_path)
    assert card_of("mynets:tiny").sizes is None  # unknown to the controller until built
    card = check_model("mynets:tiny", channels_last=False)
    assert card.sizes == ((3 * 32 * 32 * 10 + 10) * 4, 0)
    assert card.augment == NO_AUGMENT == resolve_augment("mynets:tiny", {"flip": "auto"})
